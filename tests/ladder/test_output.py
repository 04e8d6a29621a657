"""CLI output: `--json` through one normaliser (fits.results.jsonable) for numpy arrays, numpy and torch
scalars, inf; tables that fit the terminal; `--format csv|md`."""

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


def _plan_json(capsys) -> list[dict]:
    from ladder.cli import main

    assert main(["plan", "cpu-demo", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["rungs"]


def test_format_csv_writes_the_tables_alone_on_stdout(capsys):
    import csv
    import io

    from ladder.cli import main

    rungs = _plan_json(capsys)
    assert main(["plan", "cpu-demo", "--format", "csv"]) == 0
    out = capsys.readouterr()
    plan_table, sources = out.out.strip().split("\n\n")  # two tables, a blank line apart
    rows = list(csv.DictReader(io.StringIO(plan_table)))
    assert [int(r["L"]) for r in rows] == [r["L"] for r in rungs]
    assert [int(r["steps"].replace(",", "")) for r in rows] == [r["steps"] for r in rungs]
    assert [float(r["FLOPs"]) for r in rows] == [float(f"{r['train_flops']:.3e}") for r in rungs]
    assert [r["source"] for r in csv.DictReader(io.StringIO(sources))] == list(rungs[-1]["sources"])
    assert "ladder plan: cpu-demo" in out.err and "ladder plan" not in out.out  # titles go to stderr


def test_format_md_writes_markdown_tables_under_their_titles(capsys):
    from ladder.cli import main

    rungs = _plan_json(capsys)
    assert main(["plan", "cpu-demo", "--format", "md"]) == 0
    lines = capsys.readouterr().out.splitlines()
    title = lines.index("**ladder plan: cpu-demo (TPP 5)**")
    header, rule, *body = lines[title + 2:title + 4 + len(rungs)]
    assert header.startswith("| L | d_model |") and set(rule.replace(" ", "")) == {"|", "-"}
    assert [int(row.split("|")[1]) for row in body] == [r["L"] for r in rungs]


def test_json_and_format_together_are_refused(capsys):
    import pytest

    from ladder.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["plan", "cpu-demo", "--json", "--format", "csv"])
    assert stop.value.code == 2 and "choose one" in capsys.readouterr().err


def test_tables_fit_the_terminals_width_and_keep_whole_rows_in_a_pipe(capsys, monkeypatch):
    from ladder.cli import main
    from ladder.cli.output import PIPED_WIDTH

    monkeypatch.setenv("COLUMNS", "90")  # what a 90-column terminal tells rich
    assert main(["plan", "mai-base-2"]) == 0
    narrow = capsys.readouterr().out.splitlines()
    assert max(map(len, narrow)) <= 90
    monkeypatch.delenv("COLUMNS")
    assert main(["plan", "mai-base-2"]) == 0
    piped = capsys.readouterr().out.splitlines()
    assert 90 < max(map(len, piped)) <= PIPED_WIDTH
    assert len(piped) < len(narrow)  # the wide table's rows are one line each
