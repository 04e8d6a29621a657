"""The tour on the demo's own runs: the Quick start of docs/fits.md runs as written on the shipped
fixture, and `ladder fit power-law`, `ladder extrapolate` and `ladder demo` fit the same law on the same
runs (the one step, `fits.compute_laws.fit_power_laws`)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pandas as pd
import pytest

from ladder.cli import main

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "notebooks" / "fixtures" / "demo_runs.csv"
DOMAINS = ["books", "code", "math", "qa", "stem", "web"]


def subcommand_default(path: list[str], dest: str):
    """The default of a flag of `ladder PATH...`, read off the parser itself."""
    from ladder.cli import build_parser

    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = sub.choices[name]
    return parser.get_default(dest)


def quick_start_commands() -> list[list[str]]:
    text = (ROOT / "docs" / "fits.md").read_text(encoding="utf-8")
    block = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.strip().splitlines()]


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory) -> dict:
    """Each Quick-start command run as written, from a directory where `notebooks/` is the repository's."""
    work = tmp_path_factory.mktemp("tour")
    (work / "notebooks").symlink_to(ROOT / "notebooks")
    capture = pytest.MonkeyPatch()
    capture.chdir(work)
    outputs = []
    try:
        for argv in quick_start_commands():
            assert argv[0] == "ladder"
            code = main(argv[1:])
            outputs.append(code)
    finally:
        capture.undo()
    return {"work": work, "codes": outputs}


def test_the_quick_start_runs_as_written_on_the_demo_fixture(quick_start):
    commands = quick_start_commands()
    assert [c[1:3] for c in commands] == [["fit", "power-law"], ["extrapolate", "cpu-demo-d2"]]
    assert "notebooks/fixtures/demo_runs.csv" in commands[0] and "--group" in commands[0]
    assert quick_start["codes"] == [0, 0]
    work = quick_start["work"]
    laws = json.loads((work / "laws.json").read_text())["power_law"]
    assert sorted(laws) == DOMAINS
    for domain, law in laws.items():  # the demo's six rungs show no floor: every domain the nested law, flagged
        assert law["floor_at_zero"] and law["params"]["E"] == 0.0 and law["n_points"] == 6, domain
        assert law["interval"]["available"] and law["ci"]["alpha"][0] < law["params"]["alpha"] < law["ci"]["alpha"][1]


def test_without_floor_auto_the_fit_is_refused_with_a_hint_to_it(capsys):
    argv = quick_start_commands()[0][1:]
    i = argv.index("--floor")
    plain = argv[:i] + argv[i + 2:]
    plain = plain[:plain.index("--save")] + ["--bootstrap", "0", "--holdout-top", "0", "--json"]
    assert main(plain) == 1
    out = capsys.readouterr()
    payload = json.loads(out.out)
    assert [f["group"] for f in payload["fits"]] == DOMAINS and all(f["E"] is None for f in payload["fits"])
    assert "--floor auto" in payload["hint"] and "--floor auto" in out.err and "Traceback" not in out.err


def test_fit_extrapolate_and_the_demo_give_the_same_law_on_the_same_runs(quick_start, capsys):
    from ladder.analysis.demo import demo_compute_laws
    from ladder.analysis.recipe_card import build_card
    from ladder.run.mlflow_runs import long_by_domain

    work = quick_start["work"]
    fitted = json.loads((work / "laws.json").read_text())["power_law"]  # `ladder fit power-law ... --save`
    # What `ladder demo` fits, on the same runs: its law step (the bootstrap, the same function with the
    # same count and seed by default, is left out here to keep the test cheap; the defaults are compared).
    demo = demo_compute_laws(long_by_domain(pd.read_csv(FIXTURE)), bootstrap=0)
    assert sorted(demo.laws) == DOMAINS and not demo.errors
    for domain in DOMAINS:
        mine = json.loads(json.dumps(demo.laws[domain].to_dict()))
        for key in ("params", "rows_used", "residuals", "floor_at_zero", "x_range"):
            assert fitted[domain][key] == mine[key], (domain, key)
        assert {k: v for k, v in fitted[domain]["options"].items() if k != "bootstrap"} == \
            {k: v for k, v in mine["options"].items() if k != "bootstrap"}
    assert subcommand_default(["demo"], "bootstrap") == subcommand_default(["fit", "power-law"], "bootstrap") == \
        fitted["code"]["options"]["bootstrap"]

    # `ladder extrapolate` fitting the laws itself from the same runs, and from the saved laws
    capsys.readouterr()
    assert main(["extrapolate", "cpu-demo-d2", "--rung", "9", "--csv", str(FIXTURE), "--floor", "auto", "--json"]) == 0
    from_runs = json.loads(capsys.readouterr().out)
    assert main(["extrapolate", "cpu-demo-d2", "--rung", "9", "--laws", str(work / "laws.json"), "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    demo_card = json.loads(json.dumps(build_card("cpu-demo-d2", 9, {"power_law": demo.laws, "files": []})))
    assert from_runs["predicted_bpb"] == from_file["predicted_bpb"]  # the same law and band
    assert {d: b["value"] for d, b in demo_card["predicted_bpb"].items()} == \
        {d: b["value"] for d, b in from_runs["predicted_bpb"].items()}
    assert from_runs["provenance"]["runs"]["power_law_selection"]["floor"]["rule"] == "auto"
    for domain, b in from_runs["predicted_bpb"].items():
        assert b["interval"][0] < b["value"] < b["interval"][1] and 2 < b["extrapolation_factor"] < 3, domain
    assert from_runs["warnings"] == []  # ×2.5 beyond the data: no warning
