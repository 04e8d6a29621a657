"""ladder_probe --unique-fraction: one source's unique cap moves, its tokens and the other sources stay."""

from __future__ import annotations

import pytest

from ladder.plan.resolve import resolve_train_config
from tests.scripts.helpers import load_script




def test_unique_fraction_keeps_tokens_and_recomputes_epochs():
    probe = load_script("ladder_probe")
    config = resolve_train_config("cpu-demo", 6, ["tpp=4"])
    math_before = dict(config["sources"]["math"])  # a copy: the last check is that the input stays as it was
    full_unique = math_before["unique_tokens"] / math_before["unique_fraction"]

    changed = probe.with_unique_fraction(config, "math", 0.99)
    math_after = changed["sources"]["math"]
    assert math_after["tokens"] == math_before["tokens"]
    assert math_after["unique_tokens"] == pytest.approx(0.99 * full_unique)
    assert math_after["epochs"] == pytest.approx(math_before["tokens"] / (0.99 * full_unique))
    assert math_after["epochs"] < math_before["epochs"]
    assert changed["sources"]["code"] == config["sources"]["code"]
    assert config["sources"]["math"] == math_before  # the input is not modified

    with pytest.raises(SystemExit, match="no source"):
        probe.with_unique_fraction(config, "poetry", 0.5)
    with pytest.raises(SystemExit, match="not in"):
        probe.with_unique_fraction(config, "math", 1.5)


def test_corpus_is_prepared_at_the_jobs_tpp(tmp_path):
    # L9 fits cpu-demo's 7M-token budget at TPP 4 but not at the recipe's default TPP 5; the corpus
    # preparation once resolved the first rung at the default and refused a valid probe.
    probe = load_script("ladder_probe")
    config = probe.first_job_config("cpu-demo", [9], [4.0], tmp_path)
    assert config["tpp"] == pytest.approx(4.0)
    assert config["data_cache_root"] == str(tmp_path / "data")
