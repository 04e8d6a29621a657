"""A tiny corpus of a user's own, written by a test: JSONL sources and held-out sets, a manifest, and
(optionally) its prepared directory. A few kB per source, so preparing it takes about a second."""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml

from ladder.plan.recipe import RECIPES_DIR

WORDS = {
    "prose": "the a of cat dog runs jumps over lazy fox river stone tree house night".split(),
    "code": "def return import class self lambda for in if else print value none".split(),
    "maths": "theorem proof lemma let be integer prime sum equals zero one limit".split(),
}


def write_corpus(folder: Path, shares: dict[str, float], *, eval_domains: tuple[str, ...] | None = None,
                 train_docs: int = 60, eval_docs: int = 6) -> Path:
    """Sources named after `shares` (each with its own word list), held-out sets for `eval_domains`
    (default: every source); returns the manifest's path. Files are relative to the manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    evals = tuple(shares) if eval_domains is None else eval_domains
    for name in dict.fromkeys([*shares, *evals]):
        rng = random.Random(name)
        vocab = WORDS[name]
        for split, n in (("train", train_docs), ("eval", eval_docs)):
            lines = [json.dumps({"id": f"{name}/{split}{i}",
                                 "text": " ".join(rng.choice(vocab) for _ in range(rng.randint(30, 80)))})
                     for i in range(n)]
            (folder / f"{split}_{name}.jsonl").write_text("\n".join(lines) + "\n")
    manifest = {"name": "tiny",
                "sources": [{"name": n, "domain": n, "share": s, "files": [f"train_{n}.jsonl"]}
                            for n, s in shares.items()],
                "eval": [{"domain": d, "files": [f"eval_{d}.jsonl"]} for d in evals]}
    path = folder / "manifest.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return path


def prepare_corpus(manifest: Path, out: Path, vocab_size: int = 512) -> Path:
    from rungs.data.prepare import prepare

    return prepare(manifest, out, vocab_size=vocab_size)


def recipe_dict(**changes) -> dict:
    """The cpu-demo recipe as a dict, without its mixture, with `changes` applied."""
    data = yaml.safe_load((RECIPES_DIR / "cpu-demo.yaml").read_text())
    data.pop("mixture")
    data.update(changes)
    return data


def write_recipe(path: Path, **changes) -> Path:
    path.write_text(yaml.safe_dump(recipe_dict(**changes), sort_keys=False))
    return path
