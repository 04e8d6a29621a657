"""The trial key of every trial of every shipped spec is a contract: finished runs in MLflow are found
by it, so a refactor that moves a field, renames a default or changes the hash would silently rerun
(or orphan) every trial. `shipped_trial_keys.json` was written from the code before the 2026-12-01
refactors (commit 32031b6) by `python tests/sweeps/test_shipped_keys.py --write`; a spec edited on
purpose regenerates it in the same commit, and the diff shows which keys moved."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ladder.plan.recipe import load_recipe
from sweeps.plan import plan_sweep
from sweeps.spec import available_specs, load_spec

KEYS_FILE = Path(__file__).with_name("shipped_trial_keys.json")


def keyed_specs() -> list[str]:
    """Shipped specs whose keys are the same on every machine. A data arm's key carries the content hash of
    the corpus it names, built on the machine that runs it (sweeps/data_curation.yaml, by
    scripts/build_curation_arms.py); its keys are tested in tests/sweeps/test_data_arms.py. A spec whose recipe
    (or itself) names a corpus by `data:` keys the manifest's absolute path, which depends on where the
    checkout is (sweeps/independent_check.yaml; tests/scripts/test_build_machine_corpus.py plans it)."""
    return [n for n in available_specs()
            if not any(b.has_data_arms for b in load_spec(n).blocks) and not _names_a_corpus(n)]


def _names_a_corpus(name: str) -> bool:
    spec = load_spec(name)
    return spec.data is not None or load_recipe(spec.recipe).data is not None


def shipped_trial_keys() -> dict[str, dict[str, str]]:
    return {name: {p.label: p.key for p in plan_sweep(load_spec(name), where=name)} for name in keyed_specs()}


RECORDED: dict[str, dict[str, str]] = json.loads(KEYS_FILE.read_text())


def test_every_shipped_spec_has_recorded_keys():
    assert sorted(RECORDED) == keyed_specs()


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_shipped_spec_keys_are_unchanged(name):
    now = {p.label: p.key for p in plan_sweep(load_spec(name), where=name)}
    moved = {label: (RECORDED[name].get(label), key) for label, key in now.items() if RECORDED[name].get(label) != key}
    assert not moved, f"{name}: trial keys changed (recorded, now): {moved}"
    assert set(now) == set(RECORDED[name])


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    KEYS_FILE.write_text(json.dumps(shipped_trial_keys(), indent=1, sort_keys=True) + "\n")
