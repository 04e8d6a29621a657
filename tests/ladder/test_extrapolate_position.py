"""`ladder extrapolate` says where the target lies against the compute each law was fitted on: beyond the
largest FLOPs (with the factor), inside the fitted range, or below the smallest. A target inside or below
the data used to be printed as "(×0.0964 beyond the data)"."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pandas as pd
import pytest

from ladder.cli import main
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe


def _run(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def laws(tmp_path_factory):
    """Three domains fitted on six rungs each: below, around and above cpu-demo L8's training FLOPs."""
    tmp = tmp_path_factory.mktemp("position")
    target = plan_rung(load_recipe("cpu-demo"), 8, None).train_flops
    spans = {"under": (target / 1e4, target / 10), "around": (target / 30, target * 30),
             "over": (target * 10, target * 1e4)}
    frames = []
    for domain, (lo, hi) in spans.items():
        flops = np.geomspace(lo, hi, 6)
        frames.append(pd.DataFrame({"train_flops": flops, "bpb": 0.6 + 40.0 * flops ** -0.08, "domain": domain}))
    pd.concat(frames, ignore_index=True).to_csv(tmp / "runs.csv", index=False)
    _run(["fit", "power-law", "--csv", str(tmp / "runs.csv"), "--x", "train_flops", "--y", "bpb", "--group", "domain",
          "--bootstrap", "20", "--floor", "auto", "--save", str(tmp / "laws.json"), "--json"])
    return {"path": str(tmp / "laws.json"), "target": target, "spans": spans}


def test_the_card_says_beyond_inside_or_below_the_data_in_the_table_and_the_json(laws):
    argv = ["extrapolate", "cpu-demo", "--rung", "8", "--laws", laws["path"]]
    card = json.loads(_run([*argv, "--json"]))
    bpb = card["predicted_bpb"]
    assert {d: b["data_position"] for d, b in bpb.items()} == {"under": "beyond", "around": "inside", "over": "below"}
    for domain, (lo, hi) in laws["spans"].items():
        assert bpb[domain]["data_flops_range"] == pytest.approx([lo, hi], rel=1e-9)
    assert bpb["under"]["extrapolation_factor"] == pytest.approx(10.0, rel=1e-9)
    rows = {line.split("│")[1].strip(): line for line in _run(argv).splitlines() if "│ BPB " in line}
    assert "(×10 beyond the data)" in rows["BPB under"]
    assert "(inside the data)" in rows["BPB around"] and "beyond" not in rows["BPB around"]
    assert "(below the data)" in rows["BPB over"] and "beyond" not in rows["BPB over"]
