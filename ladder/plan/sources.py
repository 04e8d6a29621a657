"""Source scaling: cap each source's unique data so its repetition count is the same at every rung.

At full scale source s is seen e_s = w_s·T_full / U_s times (w_s its share, U_s its unique
tokens). A rung with budget T sees U_s·T/T_full unique tokens of s, cycled e_s times: the same
repetition and the same unique-data-per-parameter ratio as the full run. Caps are a fixed
fraction T/T_full of every source, so a smaller rung's subset is contained in a larger one's
when the sampler picks documents by a hash threshold (`unique_fraction`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ladder.errors import LadderInputError
from ladder.plan.recipe import SHARE_TOLERANCE, Source


@dataclass(frozen=True)
class SourceAllocation:
    name: str
    share: float
    tokens: float  # training tokens drawn from this source at this rung
    unique_tokens: float  # the cap: distinct tokens this rung may see
    epochs: float  # tokens / unique_tokens, equal to the full-scale repetition count
    unique_fraction: float  # unique_tokens / full-scale unique tokens (= T_rung / T_full)


def plan_sources(mixture: list[Source], rung_tokens: float, full_scale_tokens: float, *,
                 rounding_tokens: float = 0.0) -> dict[str, SourceAllocation]:
    """Each source's allocation at a rung of `rung_tokens`. `rounding_tokens` is how far the rung's budget
    was rounded up past its target (to whole batches): a rung may pass `full_scale_tokens` by that much
    (a full-scale rung at its own budget), its caps then the whole sources."""
    if rung_tokens <= 0:
        raise LadderInputError(f"rung token budget must be positive, got {rung_tokens:g}", field="tokens")
    if rung_tokens - rounding_tokens > full_scale_tokens * (1 + 1e-9):
        raise LadderInputError(
            f"rung budget {rung_tokens:,.0f} tokens exceeds the full-scale budget {full_scale_tokens:,.0f}; "
            "source scaling only shrinks data, so a rung must not train on more tokens than the full run "
            "(lower TPP, choose a smaller rung, or raise full_scale_tokens)",
            field="full_scale_tokens",
        )
    total_share = sum(s.share for s in mixture)
    if abs(total_share - 1.0) > SHARE_TOLERANCE:
        raise LadderInputError(f"source shares sum to {total_share:.6g}; they must sum to 1", field="mixture")
    bare = [s.name for s in mixture if s.unique_tokens is None]
    if bare:
        raise LadderInputError(f"sources {bare} have no unique_tokens (a recipe takes them from prepared `data:`)",
                               field="mixture")
    fraction = min(1.0, rung_tokens / full_scale_tokens)
    plan: dict[str, SourceAllocation] = {}
    for s in mixture:
        epochs = s.share * full_scale_tokens / s.unique_tokens
        unique = s.unique_tokens * fraction
        plan[s.name] = SourceAllocation(
            name=s.name,
            share=s.share,
            tokens=s.share * rung_tokens,
            unique_tokens=unique,
            epochs=epochs,
            unique_fraction=fraction,
        )
    return plan
