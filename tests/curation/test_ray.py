"""The curation on Ray (local, 2 workers) gives the attributes it gives in one process: one Ray start for the
file (curate joins a Ray this process already has)."""

from __future__ import annotations

import pytest

from ladder.run.curate import run_curation
from tests.curation.corpus import write_corpus
from tests.curation.test_pipeline import attributes


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_two_ray_workers_keep_what_one_process_keeps(local_ray, tmp_path):
    write_corpus(tmp_path / "corpus", files_per_source=3, docs_per_file=20, seed=5)
    manifest = tmp_path / "corpus" / "manifest.yaml"
    one = run_curation(manifest, tmp_path / "one", taggers=["exact", "near"], workers=1, progress=False)
    two = run_curation(manifest, tmp_path / "two", taggers=["exact", "near"], workers=2, progress=False)
    for tagger in ("exact", "near"):
        assert attributes(tmp_path / "two", tagger) == attributes(tmp_path / "one", tagger)
    assert one["steps"] == two["steps"] and two["steps"]["near"]["a"]["docs_removed"] >= 2
