"""Mixing rules: which documents an arm keeps and how it weights them, validated at the edge.

    name: dedup-top30                    # optional: the arm's name
    exact_duplicates: keep_one           # of each exact-duplicate cluster keep its smallest uid
    near_duplicates: keep_one            # the same for near-duplicate (MinHash + Jaccard) clusters
    semantic_duplicates: keep_one        # SemDeDup's choice within each semantic cluster
    quality: {source: web, keep_top: 0.3}   # or a list of these; no `source`: every source
    diversity: weight                    # a per-document `weight` field from the diversity weights
    subsample: 0.5                       # a control: keep this fraction of each source's (still kept) documents,
                                         # the smallest uids (a hash of the id: a random, reproducible sample)

Filters apply in the order above (exact, near, semantic, quality, subsample), each to what the ones before kept,
and the report counts what each removed. Each rule but subsample reads one attribute set, and names the tagger
that writes it when it is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rungs.data.errors import DataInputError

RULE_ATTRIBUTES = {"exact_duplicates": "exact", "near_duplicates": "near", "semantic_duplicates": "semantic",
                   "quality": "quality", "diversity": "diversity"}
FILTER_ORDER = ("exact_duplicates", "near_duplicates", "semantic_duplicates", "quality", "subsample")


class QualityRule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str | list[str] | None = None  # None: every source
    keep_top: float = Field(gt=0, le=1)  # the fraction of the source's documents (still kept) with the highest scores

    def sources(self, all_sources: list[str]) -> list[str]:
        if self.source is None:
            return list(all_sources)
        return [self.source] if isinstance(self.source, str) else list(self.source)


class Rules(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    exact_duplicates: Literal["keep_one"] | None = None
    near_duplicates: Literal["keep_one"] | None = None
    semantic_duplicates: Literal["keep_one"] | None = None
    quality: QualityRule | list[QualityRule] | None = None
    diversity: Literal["weight"] | None = None
    subsample: float | None = Field(default=None, gt=0, le=1)

    def active(self) -> list[str]:
        return [r for r in (*RULE_ATTRIBUTES, "subsample") if getattr(self, r) is not None]

    def quality_rules(self) -> list[QualityRule]:
        if self.quality is None:
            return []
        return self.quality if isinstance(self.quality, list) else [self.quality]


def load_rules(path: str | Path) -> Rules:
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise DataInputError("rules file not found", where=where)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise DataInputError(f"not valid YAML ({' '.join(str(err).split())})", where=where) from None
    if not isinstance(raw, dict) or not raw:
        raise DataInputError(f"expected a mapping of rules; valid keys: name, {', '.join(RULE_ATTRIBUTES)}, subsample", where=where)
    try:
        return Rules.model_validate(raw)
    except ValidationError as err:
        # A union's branches each report; the branch of the input's own shape, and an unknown key, say most
        errors = [e for e in err.errors() if e["type"] not in ("model_type", "dict_type", "list_type")] or err.errors()
        first = min(errors, key=lambda e: e["type"] != "extra_forbidden")
        loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith(("QualityRule", "list[")))
        if first["type"] == "extra_forbidden":
            message = (f"unknown rule; valid: name, {', '.join(RULE_ATTRIBUTES)}, subsample" if len(first["loc"]) == 1 else
                       "unknown key; valid: source, keep_top")
        elif first["type"] == "literal_error":
            message = f"got {first.get('input')!r}; {first['msg'].lower()}"
        else:
            message = f"{first['msg'].lower()} (got {first.get('input')!r})"
        raise DataInputError(message, where=where, field=loc or None) from None


def check_sources(rules: Rules, sources: list[str], where: str) -> None:
    """Every source a quality rule names exists, and no source has two rules (their fractions would compound:
    two `keep_top: 0.5` keep a quarter)."""
    ruled: dict[str, int] = {}
    for k, q in enumerate(rules.quality_rules()):
        field = "quality.source" if not isinstance(rules.quality, list) else f"quality.{k}.source"
        unknown = sorted(set(q.sources(sources)) - set(sources))
        if unknown:
            raise DataInputError(f"unknown source(s) {unknown}; the curated manifest's: {sorted(sources)}", where=where,
                                 field=field)
        named = q.sources(sources)
        if not named:  # `source: []`: a rule that filters nothing is a list left empty by mistake
            raise DataInputError("names no source (an empty list); name the sources to filter, or leave `source` "
                                 "out for every source", where=where, field=field)
        for source in named:
            if source in ruled:
                earlier = "earlier in this rule's list" if ruled[source] == k else f"in quality.{ruled[source]}"
                raise DataInputError(f"source {source!r} is named twice ({earlier}); two rules would compound their "
                                     f"keep_top fractions: give it one rule", where=where, field=field)
            ruled[source] = k
