"""Build the data arms of sweeps/data_curation.yaml on the demo corpus, reproducibly.

    .venv/bin/python scripts/build_curation_arms.py [--out runs/curation-arms]

1. tag the demo corpus once (`ladder data curate demo`: exact and near duplicates, topics, semantic
   duplicates and diversity weights, and a quality classifier trained on stem, books and math against qa);
2. mix one arm per rule set (`ladder data mix`), each adding one step to the one before:
   dedup (exact + near, keep one per cluster), quality (+ keep the top half of web by quality score),
   diverse (+ D4-style diversity weights on every kept document); and a control known to be worse,
   quarter (a random quarter of every source's documents, no other rule: four times the repetition); and
   random90 (a random nine tenths of every source's documents, no other rule: the baseline's data less a
   tenth, drawn blind, the null a curated arm paired on its seed in the keyed order is measured against);
3. prepare the baseline (the demo corpus as it is) and every arm with the demo's tokenizer settings
   (`ladder data prepare ... --vocab-size 512`, a BPE trained on each corpus), so each arm's sources
   carry their own token counts: the sweep plans each arm's source scaling from them.

Every step is deterministic (uids are hashes, the classifier's split is seeded, mix writes gzip with a
fixed mtime) and resumable: a finished curation, an arm whose rules are unchanged, a prepared corpus of
the same inputs are kept. The spec names OUT/prepared/<arm>; the default OUT is the one it names.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "runs" / "curation-arms"
VOCAB_SIZE = 512  # cpu-demo-d2's vocab_size: what the training job prepares with
QUALITY = ["--quality-positive", "stem,books,math", "--quality-negative", "qa"]

DEDUP = {"exact_duplicates": "keep_one", "near_duplicates": "keep_one"}
QUALITY_RULE = {"quality": {"source": "web", "keep_top": 0.5}}
ARMS: dict[str, dict] = {
    "dedup": {"name": "dedup", **DEDUP},
    "quality": {"name": "quality", **DEDUP, **QUALITY_RULE},
    "diverse": {"name": "diverse", **DEDUP, **QUALITY_RULE, "diversity": "weight"},
    "quarter": {"name": "quarter", "subsample": 0.25},
    "random90": {"name": "random90", "subsample": 0.9},
}


def ladder(*argv: str) -> None:
    from ladder.cli import main

    t0 = time.perf_counter()
    code = main(list(argv))
    if code != 0:
        raise SystemExit(f"`ladder {' '.join(argv)}` exited {code}")
    print(f"ladder {' '.join(argv)}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def build(out: Path) -> dict[str, Path]:
    from rungs.data.manifest import DEMO_MANIFEST

    curation = out / "curation"
    ladder("data", "curate", "demo", "--out", str(curation), *QUALITY, "--json")
    prepared = {"baseline": out / "prepared" / "baseline"}
    ladder("data", "prepare", str(DEMO_MANIFEST), "--out", str(prepared["baseline"]), "--vocab-size", str(VOCAB_SIZE),
           "--json")
    for arm, rules in ARMS.items():
        arm_dir = out / "arms" / arm
        rules_path = out / "rules" / f"{arm}.yaml"
        rules_path.parent.mkdir(parents=True, exist_ok=True)
        rules_path.write_text(yaml.safe_dump(rules, sort_keys=False))
        meta = arm_dir / "arm.json"
        same = meta.is_file() and json.loads(meta.read_text()).get("rules") == \
            {k: v for k, v in rules.items() if v is not None}
        if not same:  # a re-mix rewrites the files: only when the rules changed
            ladder("data", "mix", str(curation), "--rules", str(rules_path), "--out", str(arm_dir), "--json")
        prepared[arm] = out / "prepared" / arm
        ladder("data", "prepare", str(arm_dir / "manifest.yaml"), "--out", str(prepared[arm]),
               "--vocab-size", str(VOCAB_SIZE), "--json")
    return prepared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    prepared = build(args.out.resolve())
    for arm, path in prepared.items():
        meta = json.loads((path / "meta.json").read_text())
        tokens = {s["name"]: round(s.get("weighted_tokens", s["tokens"])) for s in meta["sources"]}
        print(f"{arm}: {path} {tokens}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
