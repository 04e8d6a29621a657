"""Data arms in a sweep: each arm plans on its own corpus's unique tokens, its content is in its trial keys,
and every arm scores on the same held-out sets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from ladder.errors import LadderInputError
from ladder.plan.recipe import Source
from ladder.plan.sources import plan_sources
from rungs.data.corpus import PreparedCorpus
from sweeps.plan import plan_sweep
from sweeps.spec import load_spec
from tests.ladder.tiny_corpus import prepare_corpus, write_corpus, write_recipe

SHARES = {"prose": 0.6, "code": 0.4}


def write_arm(folder: Path, base_manifest: Path, keep_every: int, *, own_eval: bool = False) -> Path:
    """An arm of the base corpus keeping every `keep_every`-th training document, scored on the base's
    held-out files (as `ladder data mix` writes it), or on its own edited copy of them."""
    folder.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(base_manifest.read_text())
    for s in base["sources"]:
        lines = (base_manifest.parent / s["files"][0]).read_text().splitlines()
        (folder / s["files"][0]).write_text("\n".join(lines[::keep_every]) + "\n")
    for e in base["eval"]:
        source = base_manifest.parent / e["files"][0]
        if own_eval:
            edited = [json.loads(line) for line in source.read_text().splitlines()]
            edited[0]["text"] += " river"
            (folder / e["files"][0]).write_text("".join(json.dumps(r) + "\n" for r in edited))
        else:
            e["files"] = [str(source.resolve())]
    path = folder / "manifest.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("arms")
    manifest = write_corpus(root / "base", SHARES, train_docs=80)
    base = prepare_corpus(manifest, root / "base" / "prepared")
    half = prepare_corpus(write_arm(root / "half", manifest, 2), root / "half" / "prepared")
    return root, manifest, base, half


def write_spec(root: Path, arms: dict, name: str = "spec.yaml", **block) -> Path:
    recipe = write_recipe(root / "recipe.yaml", data=str(root / "base" / "prepared"))
    spec = {"name": "arms", "recipe": str(recipe), "seeds": [0, 1],
            "blocks": [{"name": "b", "rungs": [2, 3], "arms": arms, **block}]}
    path = root / name
    path.write_text(yaml.safe_dump(spec))
    return path


def keyed(path: Path) -> dict[tuple, object]:
    return {(p.trial.arm, p.trial.L, p.trial.seed): p for p in plan_sweep(load_spec(path), where=str(path))}


def test_each_arm_plans_on_its_own_unique_tokens(corpora):
    root, _, base, half = corpora
    planned = keyed(write_spec(root, {"base": {"data": "base/prepared"}, "half": {"data": "half/prepared"}}))
    assert len(planned) == 2 * 2 * 2
    b, h = PreparedCorpus.open(base), PreparedCorpus.open(half)
    for L in (2, 3):
        full, small = planned[("base", L, 0)].config, planned[("half", L, 0)].config
        for name in SHARES:
            ratio = b.unique_tokens(name) / h.unique_tokens(name)
            assert 1.5 < ratio < 2.5
            # Same share of every rung, the same fraction of each arm's own source, repeated as its full run.
            assert small["sources"][name]["share"] == full["sources"][name]["share"]
            assert small["sources"][name]["epochs"] == pytest.approx(full["sources"][name]["epochs"] * ratio, rel=1e-12)
            assert small["sources"][name]["unique_tokens"] == pytest.approx(
                full["sources"][name]["unique_tokens"] / ratio, rel=1e-12)
        assert small["data_manifest"].endswith("half/manifest.yaml")
        assert small["data_key"] and small["data_key"] != full["data_key"]


def test_half_the_unique_tokens_is_twice_the_epochs_at_every_rung_exactly():
    full = [Source(name=n, share=s, unique_tokens=u) for (n, s), u in zip(SHARES.items(), (3.0e6, 1.1e6))]
    halved = [s.model_copy(update={"unique_tokens": s.unique_tokens / 2}) for s in full]
    for rung_tokens in (1e5, 7.3e5, 4e6, 1e7):
        a, b = plan_sources(full, rung_tokens, 1e7), plan_sources(halved, rung_tokens, 1e7)
        for name in SHARES:
            assert b[name].epochs == 2 * a[name].epochs
            assert b[name].unique_tokens == a[name].unique_tokens / 2
            assert b[name].tokens == a[name].tokens


def test_a_changed_arm_reruns_only_its_own_trials(corpora):
    root, manifest, _, half = corpora
    arms = {"base": {"data": "base/prepared"}, "half": {"data": "half/prepared"}}
    before = {k: p.key for k, p in keyed(write_spec(root, arms)).items()}
    # The arm rebuilt in place with the same documents (new files, later mtimes) moves no key.
    write_arm(root / "half", manifest, 2)
    for f in (root / "half").glob("*.jsonl"):
        os.utime(f, ns=(f.stat().st_atime_ns + 10**9, f.stat().st_mtime_ns + 10**9))
    prepare_corpus(root / "half" / "manifest.yaml", half)
    same = {k: p.key for k, p in keyed(write_spec(root, arms)).items()}
    assert same == before
    # Another rule (here: keep every third document) moves that arm's keys only.
    third = prepare_corpus(write_arm(root / "third", manifest, 3), root / "third" / "prepared")
    after = {k: p.key for k, p in keyed(write_spec(root, {**arms, "half": {"data": str(third)}})).items()}
    assert {k: v for k, v in after.items() if k[0] == "base"} == {k: v for k, v in before.items() if k[0] == "base"}
    assert all(after[k] != before[k] for k in before if k[0] == "half")


def test_arms_without_data_keep_their_keys_and_carry_no_data_key(corpora):
    root, *_ = corpora
    plain = keyed(write_spec(root, {"base": {}, "warm": {"warmup_steps": 3}}))
    assert all("data_key" not in p.config or p.config["data_key"] is None for p in plain.values())
    with_arm = keyed(write_spec(root, {"base": {}, "warm": {"warmup_steps": 3}, "half": {"data": "half/prepared"}},
                                name="spec2.yaml"))
    assert {k: p.key for k, p in plain.items()} == {k: p.key for k, p in with_arm.items() if k[0] != "half"}


def test_arms_scored_on_other_held_out_sets_are_refused(corpora):
    root, manifest, *_ = corpora
    prepare_corpus(write_arm(root / "own_eval", manifest, 2, own_eval=True), root / "own_eval" / "prepared")
    path = write_spec(root, {"base": {"data": "base/prepared"}, "own": {"data": "own_eval/prepared"}},
                      name="spec3.yaml")
    with pytest.raises(LadderInputError, match="other held-out sets than arm 'base'") as err:
        plan_sweep(load_spec(path), where=str(path))
    assert err.value.field == "blocks.b.arms.own.data"


def test_an_arm_naming_a_bare_manifest_is_told_to_prepare_it(corpora):
    root, *_ = corpora
    path = write_spec(root, {"base": {}, "raw": {"data": "half/manifest.yaml"}}, name="spec4.yaml")
    with pytest.raises(LadderInputError, match="ladder data prepare"):
        plan_sweep(load_spec(path), where=str(path))


def test_an_arm_data_that_is_not_a_path_is_refused(corpora):
    root, *_ = corpora
    path = write_spec(root, {"base": {}, "raw": {"data": 3}}, name="spec5.yaml")
    with pytest.raises(LadderInputError, match="prepared corpus"):
        load_spec(path)
