"""The shipped independent-check corpus (scripts/build_machine_corpus.py): its manifest loads, every domain
has a held-out set of at least 40 documents from origins training does not use, and no document is also
in the demo corpus, so the check runs on text the demo recipe was never tuned on."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from rungs.data.manifest import load_manifest

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "rungs" / "data" / "machine_corpus" / "manifest.yaml"
DEMO = ROOT / "rungs" / "data" / "demo" / "corpus"


def _docs(files) -> list[dict]:
    out = []
    for file in files:
        with gzip.open(str(file.path if hasattr(file, "path") else file), "rt", encoding="utf-8") as f:
            out += [json.loads(line) for line in f]
    return out


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _origin(doc_id: str) -> str:
    return doc_id.rsplit("#", 1)[0]


def test_manifest_loads_with_five_domains_each_held_out():
    manifest = load_manifest(MANIFEST)
    domains = {s.domain for s in manifest.sources}
    assert len(domains) == 5
    assert {e.domain for e in manifest.eval_sets} == domains
    assert abs(sum(s.share for s in manifest.sources) - 1) < 1e-9


def test_held_out_sets_are_large_and_disjoint_from_training_by_text_and_origin():
    manifest = load_manifest(MANIFEST)
    demo = {_hash(d["text"]) for d in _docs(sorted(DEMO.glob("*.jsonl.gz")))}
    assert demo
    for source in manifest.sources:
        train = _docs(source.files)
        held = _docs(next(e for e in manifest.eval_sets if e.domain == source.domain).files)
        assert len(held) >= 40, source.domain
        train_texts = {_hash(d["text"]) for d in train}
        held_texts = {_hash(d["text"]) for d in held}
        assert not held_texts & train_texts, source.domain
        assert not {_origin(d["id"]) for d in held} & {_origin(d["id"]) for d in train}, source.domain
        assert not (train_texts | held_texts) & demo, source.domain
        assert len(train_texts) == len(train) and len(held_texts) == len(held), source.domain  # deduplicated


def test_independent_check_spec_plans_the_demo_rungs_on_this_corpus():
    from sweeps.plan import plan_sweep
    from sweeps.spec import load_spec

    demo = {p.trial.label: p.config for p in plan_sweep(load_spec("demo"), where="demo")}
    check = plan_sweep(load_spec("independent_check"), where="independent_check")
    assert sorted(p.trial.label for p in check) == sorted(k for k in demo if k.startswith("ladder "))
    for p in check:
        assert p.config["data_manifest"] == str(MANIFEST)
        # Everything but the corpus (its sources, their epochs) is the demo trial's: model, tokens, LR, WD, seed.
        same = {k: v for k, v in p.config.items() if k not in ("data_manifest", "recipe", "sources")}
        assert same == {k: v for k, v in demo[p.trial.label].items() if k in same}, p.trial.label
