"""The spec that gives each arm, at each rung, the seeds a fit says its EG interval needs.

`ladder fit arms --against rung` names, per arm and rung, the seeds a side that would make the interval the
target width (`fits.eg_same_rung`: "seeds a side for ±10%"). `raised_spec` turns those numbers into a sweep:
the original spec with one block per (block, arm, rung), each holding its seeds so far and the new ones. Trial
keys name the resolved config, not the block, so a run of it skips every trial already finished and trains
only the new seeds, into the same experiment.

New seeds are the smallest not used at that rung by any block of the spec. An arm that shares the baseline's
seeds at a rung (its seeds there are among the baseline's: arms of one ablation start from the same weights)
gets the baseline's new seeds too, so it stays paired; an arm on seeds of its own (a calibration replica, which
on the baseline's seeds and data would repeat its runs exactly) gets fresh ones. The baseline at a rung needs
the most any arm there needs: each comparison is n seeds a side.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from sweeps.spec import SweepSpec

__all__ = ["raised_spec"]


def _cells(spec: SweepSpec) -> Iterator[tuple[int, str, int, list[int]]]:
    """(block index, arm, rung, seeds) for every arm of every block at every rung."""
    for i, block in enumerate(spec.blocks):
        seeds = list(block.seeds if block.seeds is not None else spec.seeds)
        for arm in block.arms:
            for rung in block.rungs:
                yield i, arm, rung, seeds


def raised_spec(spec: SweepSpec, needed: Mapping[tuple[str, int], int], *, baseline: str,
                run_seeds: Mapping[tuple[str, int], Iterable[int]] | None = None,
                ) -> tuple[dict[str, Any], dict[tuple[str, int], list[int]], list[tuple[str, int]]]:
    """The spec as a mapping (paths absolute, as `load_spec` gives them), its blocks split per (block, arm,
    rung) and each (arm, rung) in `needed` raised to that many seeds; the seeds added to each; and the cells
    of `needed` the spec does not run, left out. `run_seeds`: the seeds the fit's runs had per (arm, rung),
    which may come from other specs of the experiment too: they count towards the number, and no new seed
    repeats one. An (arm, rung) already at its number keeps its seeds. Raises ValueError where the spec runs
    none of `needed`'s cells (another sweep's spec)."""
    cells = list(_cells(spec))
    have: dict[tuple[str, int], set[int]] = {}
    used: dict[int, set[int]] = {}
    for _, arm, rung, seeds in cells:
        have.setdefault((arm, rung), set()).update(seeds)
        used.setdefault(rung, set()).update(seeds)
    for (arm, rung), seeds in (run_seeds or {}).items():
        used.setdefault(rung, set()).update(seeds)
        if (arm, rung) in have:
            have[(arm, rung)].update(seeds)
    skipped = sorted(k for k in needed if k not in have)
    if needed and len(skipped) == len(needed):
        raise ValueError(f"the spec runs none of the fit's (arm, rung) {skipped}; it runs {sorted(have)}")
    want = {k: n for k, n in needed.items() if k in have}
    for (arm, rung), n in list(want.items()):  # n a side: the baseline at least as many as any arm there
        if arm != baseline and (baseline, rung) in have:
            want[(baseline, rung)] = max(want.get((baseline, rung), 0), n)

    def fresh(rung: int, k: int) -> list[int]:
        out, seed = [], 0
        while len(out) < k:
            if seed not in used[rung]:
                out.append(seed)
                used[rung].add(seed)
            seed += 1
        return out

    added: dict[tuple[str, int], list[int]] = {}
    for (arm, rung), n in sorted(want.items(), key=lambda kv: kv[0][0] != baseline):  # the baseline first
        k = n - len(have[(arm, rung)])
        if k <= 0:
            continue
        base_new = added.get((baseline, rung), [])
        if arm != baseline and (baseline, rung) in have and have[(arm, rung)] <= have[(baseline, rung)]:
            shared = base_new[:k]
            added[(arm, rung)] = shared + fresh(rung, k - len(shared))
        else:
            added[(arm, rung)] = fresh(rung, k)
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data["name"] = f"{spec.name}_raised"
    raw_blocks = data["blocks"]
    blocks = []
    for i, arm, rung, seeds in cells:
        block = dict(raw_blocks[i])
        block.update(name=f"{spec.blocks[i].name}-{arm}-L{rung}", rungs=[rung],
                     arms={arm: dict(spec.blocks[i].arms[arm])},
                     seeds=sorted(set(seeds) | set(added.get((arm, rung), []))))
        blocks.append(block)
    data["blocks"] = blocks
    return data, added, skipped
