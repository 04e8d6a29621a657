"""`--json` output: one normaliser (fits.results.jsonable) for numpy arrays, numpy and torch scalars, inf."""

from __future__ import annotations

import json

import numpy as np
import torch

from ladder.cli.output import print_json


def test_print_json_writes_arrays_scalars_and_non_finite_values_as_plain_json(capsys):
    print_json({"draws": np.array([1.5, 2.5]), "n": np.int64(3), "ok": np.bool_(True), "loss": torch.tensor(0.25),
                "bad": float("inf"), "nested": [np.float32(0.5), {"x": np.nan}]})
    assert json.loads(capsys.readouterr().out) == {"draws": [1.5, 2.5], "n": 3, "ok": True, "loss": 0.25,
                                                   "bad": None, "nested": [0.5, {"x": None}]}


def test_progress_goes_to_stderr_one_line_each(capsys):
    from ladder.cli.output import progress_line

    progress_line("[1/2] planning")
    progress_line("[2/2] running")
    out = capsys.readouterr()
    assert out.out == "" and out.err == "[1/2] planning\n[2/2] running\n"
