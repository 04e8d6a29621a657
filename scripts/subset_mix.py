"""Each rung's mix of collections in a source's unique subset, under the stratified and the plain rule.

Source scaling trains rung L on a capped unique subset of every source (`rungs.data.sampler`). This
prints, per rung of a recipe at one TPP, how many of those unique tokens come from each collection
of the source (a document id up to its first '/'), once per subset rule, as JSON lines:

    python scripts/subset_mix.py cpu-demo --tpp 4 --rungs 4-9 --source math qa web \
        > docs/backtest_diagnosis/subset_mix_cpu-demo_tpp4.jsonl

Under the plain hash prefix a few large documents swing the mix from rung to rung; the stratified
rule (the default since 2026-11-30) keeps it at the source's own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from rungs.data.corpus import PreparedCorpus
from rungs.data.prepare import ensure_prepared
from rungs.data.sampler import collection_tokens, select_subset


def subset_mix(shard, source: str, cap_tokens: int, *, stratified: bool) -> dict[str, int]:
    """Unique tokens per collection of the source's subset at `cap_tokens`."""
    return collection_tokens(shard, *select_subset(shard, source, cap_tokens, stratified=stratified))


def parse_rungs(text: str) -> list[int]:
    if "-" in text:
        lo, hi = (int(v) for v in text.split("-", 1))
        if lo > hi:
            raise ValueError(f"rung range {text!r} runs backwards")
        return list(range(lo, hi + 1))
    return [int(v) for v in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="recipe name, e.g. cpu-demo")
    parser.add_argument("--tpp", type=float, default=None, help="tokens per parameter (default: the recipe's)")
    parser.add_argument("--rungs", required=True, help="'4-9' or '4,6,8'")
    parser.add_argument("--source", nargs="+", required=True, help="training sources to show")
    parser.add_argument("--cache-root", type=Path, default=Path("runs/data"))
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    corpus = PreparedCorpus.open(ensure_prepared(vocab_size=recipe.vocab_size, cache_root=args.cache_root))
    for source in args.source:
        if source not in corpus.train_sources:
            parser.error(f"source {source!r} is not in the corpus (it has {corpus.train_sources})")
        shard = corpus.train_shard(source)
        whole = subset_mix(shard, source, shard.n_tokens, stratified=False)
        for L in parse_rungs(args.rungs):
            cap = round(plan_rung(recipe, L, tpp=args.tpp).to_dict()["sources"][source]["unique_tokens"])
            for rule in ("stratified", "prefix"):
                mix = subset_mix(shard, source, cap, stratified=rule == "stratified")
                print(json.dumps({"recipe": recipe.name, "tpp": args.tpp or recipe.tpp, "rung": L, "source": source,
                                  "rule": rule, "unique_tokens": cap, "tokens": mix,
                                  "share": {c: round(n / cap, 4) for c, n in mix.items()},
                                  "source_share": {c: round(n / shard.n_tokens, 4) for c, n in whole.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
