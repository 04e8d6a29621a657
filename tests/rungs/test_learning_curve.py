"""The MLflow learning curve `bpb/<domain>` is the intermediate sample at every point, the last one
included; the final eval (every held-out document) is logged only as `final_bpb/<domain>`, with its
standard error `final_bpb_se/<domain>`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from ladder.run.mlflow_runs import domains_of, fit_table, read_runs
from rungs.train import train
from tests.rungs.train_helpers import tiny_config


def test_the_curve_ends_on_the_sample_and_the_final_eval_has_its_own_keys(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # The sample is each domain's first document (a one-token budget), the final eval its first two.
    cfg = tiny_config(max_steps=4, eval_interval=2, tracking_uri=uri, experiment_name="curve",
                      eval_tokens_per_domain=1, final_eval_max_docs_per_domain=2)
    res = train(cfg, run_dir=tmp_path / "run", progress=False)
    evals = json.loads((tmp_path / "run" / "eval.json").read_text())["evals"]
    assert [(e["step"], e["final"]) for e in evals] == [(2, False), (4, True)]
    sample_at_2, final = evals[0], evals[1]
    assert set(sample_at_2["docs"].values()) == {1} and set(final["docs"].values()) == {2}
    client = MlflowClient(uri)
    metrics = client.get_run(res.run_id).data.metrics
    for domain, final_bpb in res.bpb.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(res.run_id, f"bpb/{domain}"))
        assert [step for step, _ in history] == [2, 4]
        assert history[0][1] == sample_at_2["bpb"][domain]
        assert history[-1][1] == final["sample_bpb"][domain]  # the sample's documents at the last step
        assert history[-1][1] != final_bpb  # ... not the final eval's
        assert metrics[f"final_bpb/{domain}"] == final_bpb == final["bpb"][domain]
        assert metrics[f"final_bpb_se/{domain}"] == res.bpb_se[domain] == final["bpb_se"][domain] > 0
        # each held-out document's bits and bytes: the final BPB is their ratio of sums (fits.heldout_noise)
        bits, nbytes = final["doc_bits"][domain], final["doc_bytes"][domain]
        assert len(bits) == len(nbytes) == 2 and all(b > 0 for b in bits)
        assert sum(bits) / sum(nbytes) == pytest.approx(final_bpb, rel=1e-9)
    assert "doc_bits" not in sample_at_2  # the intermediate eval keeps none
    stored = json.loads((tmp_path / "run" / "result.json").read_text())
    assert stored["bpb_se"] == res.bpb_se and set(res.bpb_se) == set(res.bpb)
    table = fit_table(read_runs("curve", uri))  # the fits' table: bpb_se_<domain> beside bpb_<domain>
    assert domains_of(table) == sorted(res.bpb)
    for domain, se in res.bpb_se.items():
        assert table.loc[0, f"bpb_se_{domain}"] == se and table.loc[0, f"bpb_{domain}"] == res.bpb[domain]
