"""Bad input to `ladder plan`, `ladder sweep run|status`, `ladder train --set` and `ladder extrapolate
--laws`: exit 2, one line that names the file (or flag) and the field, nothing written.

Run in-process (ladder.cli.main) from an empty working directory, so "nothing written" is checked
as "the directory is still empty": no runs/, no MLflow store, no lock file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ladder.cli import main
from ladder.plan.recipe import RECIPES_DIR
from sweeps.spec import SWEEPS_DIR

SMOKE = yaml.safe_load((SWEEPS_DIR / "smoke.yaml").read_text())
CPU_DEMO = yaml.safe_load((RECIPES_DIR / "cpu-demo.yaml").read_text())


def _spec(**changes) -> dict:
    return {**SMOKE, **changes}


def _block(**changes) -> list[dict]:
    return [{**SMOKE["blocks"][0], **changes}]


def _write(where: Path, name: str, content) -> str:
    path = where / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(yaml.safe_dump(content))
    return str(path)


def _run_in_empty_dir(tmp_path: Path, monkeypatch, capsys, argv: list[str]) -> tuple[int, str, str, list[str]]:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err, sorted(p.name for p in work.iterdir())


def refused(rc: int, out: str, err: str, *says: str) -> str:
    """Exit 2, nothing on stdout, no traceback, one error line that says each of `says`; that line."""
    assert rc == 2, err
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for word in says:
        assert word in lines[0], lines[0]
    return lines[0]


def _assert_refused(rc: int, out: str, err: str, left: list[str], *says: str) -> None:
    refused(rc, out, err, *says)
    assert left == [], f"bad input left files behind: {left}"


# (case id, spec content: a dict dumped as YAML, or raw text/bytes, words the error line must contain)
BAD_SPECS = [
    ("malformed-yaml", "name: x\nblocks: [\n", ["spec.yaml", "not valid YAML at line 3, column 1"]),
    ("malformed-yaml-mid-file", "name: x\nblocks: [1, 2\nrecipe: 3\n",
     ["spec.yaml", "line 3, column 7", "flow sequence that starts at line 2, column 9"]),
    ("not-utf8", b"name: smoke\xff\xfe\nrecipe: cpu-demo\n", ["spec.yaml", "not UTF-8"]),
    ("not-a-mapping", "- a\n- b\n", ["spec.yaml", "mapping"]),
    ("unknown-top-key", _spec(bogus=1), ["spec.yaml", "bogus", "unknown key"]),
    ("unknown-block-key", _spec(blocks=_block(rung=[3])), ["spec.yaml", "blocks.lr.rung", "unknown key"]),
    ("rungs-wrong-type", _spec(blocks=_block(rungs="three")), ["spec.yaml", "blocks.lr.rungs"]),
    ("rungs-zero", _spec(blocks=_block(rungs=[0])), ["spec.yaml", "blocks.lr.rungs", "positive"]),
    ("rungs-negative", _spec(blocks=_block(rungs=[-3])), ["spec.yaml", "blocks.lr.rungs", "positive"]),
    ("rungs-empty", _spec(blocks=_block(rungs=[])), ["spec.yaml", "blocks.lr.rungs"]),
    ("tpp-zero", _spec(blocks=_block(tpp=[0])), ["spec.yaml", "blocks.lr.tpp", "positive"]),
    ("tpp-negative", _spec(blocks=_block(tpp=[-5])), ["spec.yaml", "blocks.lr.tpp", "positive"]),
    ("tpp-inf", _spec(blocks=_block(tpp=[float("inf")])), ["spec.yaml", "blocks.lr.tpp", "finite"]),
    ("lr-zero", _spec(blocks=_block(lr_wd={"centre": {"lr": 0, "weight_decay": 0.1}})),
     ["spec.yaml", "blocks.lr.lr_wd.centre.lr", "greater than 0"]),
    ("lr-negative", _spec(blocks=_block(lr_wd={"centre": {"lr": -0.01, "weight_decay": 0.1}})),
     ["spec.yaml", "blocks.lr.lr_wd.centre.lr", "greater than 0"]),
    ("lr-inf", _spec(blocks=_block(lr_wd={"centre": {"lr": float("inf"), "weight_decay": 0.1}})),
     ["spec.yaml", "blocks.lr.lr_wd.centre.lr", "finite"]),
    ("lr-nan-override", _spec(overrides={"lr": float("nan")}), ["spec.yaml", "overrides.lr", "finite"]),
    ("empty-grid", _spec(blocks=_block(lr_wd={"log_lr": {"offsets": []}})), ["spec.yaml", "no points"]),
    ("offset-out-of-range", _spec(blocks=_block(lr_wd={"log_lr": {"offsets": [1000]}})),
     ["spec.yaml", "blocks.lr.lr_wd.log_lr", "natural-log"]),
    ("no-blocks", _spec(blocks=[]), ["spec.yaml", "blocks"]),
    ("unknown-recipe", _spec(recipe="no-such-recipe"), ["spec.yaml", "recipe", "no recipe named"]),
    ("unknown-override", _spec(overrides={"no_such_knob": 1}), ["spec.yaml", "unknown override key"]),
    ("bad-override-value", _spec(overrides={"batch_sequences": "many"}), ["spec.yaml", "batch_sequences"]),
    ("negative-override-value", _spec(overrides={"batch_sequences": -4}), ["spec.yaml", "batch_sequences"]),
    ("max-steps-zero", _spec(max_steps=0), ["spec.yaml", "max_steps"]),
    ("max-concurrent-zero", _spec(max_concurrent=0), ["spec.yaml", "max_concurrent"]),
    ("gpu-memory-not-a-size", _spec(resources={"gpu_memory": "lots"}), ["spec.yaml", "resources.gpu_memory", "141GB"]),
    ("gpu-memory-no-unit", _spec(blocks=_block(resources={"gpu_memory": "80"})),
     ["spec.yaml", "blocks.lr.resources.gpu_memory", "unit"]),
]


@pytest.mark.parametrize("command", ["run", "status"])
@pytest.mark.parametrize("case, content, says", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_sweep_spec_exits_2_with_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, command, case,
                                                                 content, says):
    spec = _write(tmp_path, "spec.yaml", content)
    result = _run_in_empty_dir(tmp_path, monkeypatch, capsys, ["sweep", command, spec])
    _assert_refused(*result, *says)


def _recipe(**changes) -> dict:
    return {**CPU_DEMO, **changes}


BAD_RECIPES = [
    ("malformed-yaml", "name: x\nwidth: {numerator: 16\n", ["recipe.yaml", "not valid YAML at line 3, column 1"]),
    ("not-utf8", b"name: cpu\xff\n", ["recipe.yaml", "not UTF-8"]),
    ("unknown-key", _recipe(n_layers=3), ["recipe.yaml", "n_layers", "unknown key"]),
    ("depth-not-a-rule", _recipe(depth=3), ["recipe.yaml", "depth", "dictionary"]),
    ("wrong-type", _recipe(vocab_size="many"), ["recipe.yaml", "vocab_size"]),
    ("tpp-zero", _recipe(tpp=0), ["recipe.yaml", "tpp", "greater than 0"]),
    ("tpp-negative", _recipe(tpp=-20), ["recipe.yaml", "tpp", "greater than 0"]),
    ("tpp-inf", _recipe(tpp=float("inf")), ["recipe.yaml", "tpp", "finite"]),
    ("rungs-zero", _recipe(ladder_rungs=[0, 3]), ["recipe.yaml", "ladder_rungs", "positive"]),
    ("rungs-empty", _recipe(ladder_rungs=[]), ["recipe.yaml", "ladder_rungs"]),
    ("full-scale-nan", _recipe(full_scale_tokens=float("nan")), ["recipe.yaml", "full_scale_tokens", "finite"]),
]


@pytest.mark.parametrize("case, content, says", BAD_RECIPES, ids=[c[0] for c in BAD_RECIPES])
def test_bad_recipe_exits_2_with_one_line(tmp_path, monkeypatch, capsys, case, content, says):
    recipe = _write(tmp_path, "recipe.yaml", content)
    result = _run_in_empty_dir(tmp_path, monkeypatch, capsys, ["plan", recipe])
    _assert_refused(*result, *says)


@pytest.mark.parametrize("argv, says", [
    (["plan", "no-such-recipe"], ["no recipe named"]),
    (["plan", "cpu-demo", "--rungs", "0"], ["--rungs", "positive"]),
    (["plan", "cpu-demo", "--rungs=-3,4"], ["--rungs", "positive"]),
    (["plan", "cpu-demo", "--rungs", "three"], ["--rungs"]),
    (["plan", "cpu-demo", "--tpp", "0"], ["--tpp", "positive"]),
    (["plan", "cpu-demo", "--tpp=-5"], ["--tpp", "positive"]),
    (["plan", "cpu-demo", "--tpp", "inf"], ["--tpp", "finite"]),
    (["plan", "cpu-demo", "--tpp", "nan"], ["--tpp", "finite"]),
    (["plan", "cpu-demo", "--gpus", "8", "--mfu", "nan"], ["--mfu"]),
    (["sweep", "run", "no-such-spec"], ["no-such-spec", "not found"]),
    (["sweep", "run", "smoke", "--max-concurrent", "0"], ["--max-concurrent"]),
    (["sweep", "plan", "no-such-spec"], ["no-such-spec", "not found"]),
    (["sweep", "plan", "smoke", "--mfu", "0"], ["--mfu", "(0, 1]"]),
    (["sweep", "plan", "smoke", "--mfu", "nan"], ["--mfu"]),
    (["sweep", "plan", "smoke", "--goodput", "1.5"], ["--goodput", "(0, 1]"]),
])
def test_bad_flags_exit_2_with_one_line(tmp_path, monkeypatch, capsys, argv, says):
    _assert_refused(*_run_in_empty_dir(tmp_path, monkeypatch, capsys, argv), *says)


@pytest.mark.parametrize("setting, says", [
    ("agc_points=[", ["--set agc_points", "cannot read"]),
    ("no_such_knob=1", ["--set", "unknown override key", "e.g. lr, weight_decay"]),
    ("lrr=0.1", ["--set", "unknown override key 'lrr'; did you mean 'lr'?"]),
    ("weightdecay=0.1", ["--set", "did you mean 'weight_decay'?"]),
    ("lr=inf", ["--set lr", "finite"]),
    ("lr=nan", ["--set lr", "finite"]),
    ("lr=-0.01", ["lr"]),
    ("tpp=fast", ["tpp", "number"]),
    ("novalue", ["--set", "key=value"]),
])
def test_bad_set_for_train_exits_2_before_anything_is_written(tmp_path, monkeypatch, capsys, setting, says):
    argv = ["train", "cpu-demo", "--rung", "3", "--set", setting, "--run-dir", str(tmp_path / "cwd" / "run")]
    _assert_refused(*_run_in_empty_dir(tmp_path, monkeypatch, capsys, argv), *says)


@pytest.mark.parametrize("content, says", [
    ("{bad", ["laws.json", "not valid JSON"]),
    (b"\xff\xfe{}", ["laws.json", "not UTF-8"]),
    ("[1, 2]", ["laws.json", "JSON object"]),
    ('{"power_law": [1, 2]}', ["laws.json", "power_law"]),
    ('{"power_law": {"code": [1]}}', ["laws.json", "power_law.code"]),
    ('{"power_law": {"code": {"a": 1}}}', ["laws.json", "power_law.code"]),
    ('{"hparams": [1]}', ["laws.json", "hparams"]),
    ('{"hparams": {"selected": 1}}', ["laws.json", "hparams.selected"]),
    ('{"hparams": {"selected": {"log_lr": {}}}}', ["laws.json", "hparams.selected"]),
])
def test_malformed_laws_file_exits_2_with_one_line(tmp_path, monkeypatch, capsys, content, says):
    laws = _write(tmp_path, "laws.json", content)
    argv = ["extrapolate", "cpu-demo", "--rung", "3", "--laws", laws]
    _assert_refused(*_run_in_empty_dir(tmp_path, monkeypatch, capsys, argv), *says)


def test_a_well_formed_laws_file_still_loads(tmp_path, monkeypatch, capsys):
    """The checks refuse shapes, not files the fits write: an empty hparams law set is fine."""
    laws = _write(tmp_path, "laws.json", json.dumps({"power_law": {}, "hparams": None}))
    rc, out, err, _ = _run_in_empty_dir(tmp_path, monkeypatch, capsys,
                                        ["extrapolate", "cpu-demo", "--rung", "3", "--laws", laws, "--json"])
    assert rc == 0, err
    assert json.loads(out)["target"]["L"] == 3


def test_a_parser_error_from_deeper_down_is_still_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """The CLI edge: an input error a reader did not name itself (here a YAML error raised inside
    a handler) exits 2 with one line; a real bug still raises."""
    import ladder.cli as cli

    def handler(args):
        yaml.safe_load("a: [")

    def bug(args):
        raise KeyError("a bug")

    for fn, expect in ((handler, 2), (bug, KeyError)):
        parser = cli.build_parser()
        monkeypatch.setattr(cli, "build_parser", lambda p=parser, f=fn: _with_handler(p, f))
        if expect == 2:
            assert cli.main(["plan", "cpu-demo"]) == 2
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1 and "not valid YAML" in err
        else:
            with pytest.raises(KeyError):
                cli.main(["plan", "cpu-demo"])


def _with_handler(parser, fn):
    real = parser.parse_args

    def parse_args(argv=None):
        args = real(argv)
        args.handler = fn
        return args

    parser.parse_args = parse_args
    return parser


def test_an_unknown_set_key_names_a_few_keys_not_all_of_them(tmp_path, monkeypatch, capsys):
    argv = ["train", "cpu-demo", "--rung", "3", "--set", "no_such_knob=1"]
    _, _, err, _ = _run_in_empty_dir(tmp_path, monkeypatch, capsys, argv)
    assert "agc_median_window_steps" not in err and len(err) < 400


@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_trial_that_cannot_fit_its_gpu_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, command):
    ladder = yaml.safe_load((SWEEPS_DIR / "mai_base_2_ladder.yaml").read_text())
    ladder["blocks"][0]["resources"]["gpu_memory"] = "40GB"  # L18 on 8 GPUs needs ~152 GB a rank
    spec = _write(tmp_path, "spec.yaml", ladder)
    result = _run_in_empty_dir(tmp_path, monkeypatch, capsys, ["sweep", command, spec])
    _assert_refused(*result, "spec.yaml", "resources", "gpus8 L18", "per rank", "36.0 GB usable")


def test_a_fit_names_a_bad_row_by_its_line_in_the_csv(tmp_path, monkeypatch, capsys):
    rows = ["train_flops,bpb,domain", "1e10,1.5,a", "2e10,1.4,a", "4e10,1.3,a", "1e10,1.5,b", "2e10,,b", "4e10,1.2,b"]
    runs = _write(tmp_path, "runs.csv", "\n".join(rows) + "\n")
    argv = ["fit", "power-law", "--csv", runs, "--x", "train_flops", "--y", "bpb", "--group", "domain"]
    rc, out, err, left = _run_in_empty_dir(tmp_path, monkeypatch, capsys, argv)
    _assert_refused(rc, out, err, left, "runs.csv", "bpb", "first at line 6")
    assert "np." not in err
