"""Bad input refused before any work starts: exit 2, one line on stderr naming the problem, nothing written.

Store URIs MLflow cannot use (a scheme it does not know, a database without its driver, Databricks without a
workspace, file stores it refuses, a plain file, an in-memory SQLite database, a store under a file), YAML
with a duplicate key, a golden file that is not the object `ladder nightly` reads, an --out under a file, and
`ladder train --tracking-uri` naming a server that is down. All in-process; nothing here starts Ray or trains.
"""

from __future__ import annotations

import os

import pytest

import ladder.run.orchestrate as orchestrate
import ladder.cli.nightly as cli_nightly
from ladder.cli import main
from ladder.plan.yaml_input import read_yaml
from ladder.errors import LadderInputError

BIG = "name: big\nrecipe: cpu-demo\nmax_steps: 2\nresources: {cpus: 1000}\nblocks:\n  - {name: b, rungs: [3]}\n"


@pytest.fixture
def work(tmp_path, monkeypatch):
    """An empty working directory; Ray, a sweep's launch and training fail the test if reached."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)

    def reached(*_a, **_k):
        raise AssertionError("work started before the input was checked")

    monkeypatch.setattr(orchestrate, "check_ray_address", reached)
    monkeypatch.setattr(orchestrate, "connect_ray", reached)
    monkeypatch.setattr(cli_nightly, "run_repeats", reached)
    import rungs.train

    monkeypatch.setattr(rungs.train, "train", reached)
    return tmp_path


def _tree(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _refused(capsys, root, argv: list[str], *says: str) -> str:
    before = _tree(root)
    capsys.readouterr()
    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 2, captured.err
    assert "Traceback" not in captured.err
    line, = captured.err.strip().splitlines()
    for word in says:
        assert word in line, line
    assert _tree(root) == before, "something was written"
    return line


# --- 6, 7: store URIs that MLflow cannot use ---------------------------------------------------------

@pytest.mark.parametrize(("uri", "says"), [
    ("postgresql://x@127.0.0.1:1/db", ["needs the Python module", "sqlite:///"]),
    ("mysql://u@127.0.0.1:1/db", ["needs the Python module", "sqlite:///"]),
    ("foo://bar", ["cannot read a store with this scheme", "sqlite:///", "http"]),
    ("databricks", ["Databricks", "sqlite:///"]),
    ("sqlite://", ["in-memory", "keeps nothing"]),
    ("sqlite:///:memory:", ["in-memory", "keeps nothing"]),
])
def test_store_uris_mlflow_cannot_use_are_refused(work, capsys, uri, says):
    if uri.startswith(("postgresql", "mysql")):
        try:
            from sqlalchemy.engine import make_url

            make_url(uri).get_dialect().import_dbapi()
            pytest.skip("the database driver is installed here")
        except ModuleNotFoundError:
            pass
    if uri == "databricks":
        pytest.importorskip("mlflow.utils.databricks_utils")
        for name in ("DATABRICKS_HOST", "DATABRICKS_TOKEN", "DATABRICKS_CONFIG_PROFILE"):
            import os

            if os.environ.get(name):
                pytest.skip("a Databricks workspace is configured here")
    _refused(capsys, work, ["sweep", "status", "smoke", "--tracking-uri", uri], "--tracking-uri", *says)


@pytest.mark.parametrize("form", ["./emptydir", "file:./emptydir"])
def test_a_file_store_directory_is_refused_as_mlflow_refuses_it(work, capsys, form):
    (work / "emptydir").mkdir()
    _refused(capsys, work, ["sweep", "status", "smoke", "--tracking-uri", form], "file stores", "sqlite:///")


def test_an_empty_directory_is_not_a_file_store_even_where_they_are_allowed(work, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    (work / "emptydir").mkdir()
    _refused(capsys, work, ["sweep", "status", "smoke", "--tracking-uri", "./emptydir"],
             "emptydir", "not an MLflow file store")


def test_a_plain_file_is_not_a_store(work, capsys):
    (work / "plain.txt").write_text("hello\n")
    _refused(capsys, work, ["sweep", "status", "smoke", "--tracking-uri", "./plain.txt"],
             "plain.txt", "is a file, not an MLflow store directory")


def test_in_memory_store_refused_by_sweep_run(work, capsys):
    (work / "big.yaml").write_text(BIG)
    _refused(capsys, work, ["sweep", "run", "big.yaml", "--tracking-uri", "sqlite://", "--new-store"], "in-memory")


def test_database_store_whose_server_does_not_answer_is_refused():
    import socket

    from ladder.run.stores import check_database_answers

    with socket.socket() as listening:  # a server that accepts: passes
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_database_answers("postgresql://u@127.0.0.1/db", "127.0.0.1", listening.getsockname()[1])
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        try:
            with pytest.raises(LadderInputError, match=f"does not answer at 127.0.0.1:{port}"):
                check_database_answers("postgresql://u@127.0.0.1/db", "127.0.0.1", port)
        finally:
            closed.close()
    check_database_answers("postgresql:///db", None, 5432)  # a Unix socket: the driver's to judge


# --- 8: a new store under a regular file ------------------------------------------------------------------

def test_new_store_under_a_file_names_the_path(work, capsys):
    (work / "big.yaml").write_text(BIG)
    (work / "afile").write_text("")
    _refused(capsys, work, ["sweep", "run", "big.yaml", "--tracking-uri", "sqlite:///afile/x.db", "--new-store"],
             "--tracking-uri", "afile", "is a file, not a directory")


# --- 5: duplicate YAML keys ----------------------------------------------------------------------------------

def test_duplicate_yaml_key_is_refused_naming_key_and_line(work, capsys):
    (work / "s.yaml").write_text("name: t\nrecipe: cpu-demo\nblocks:\n  - name: b\n    rungs: [3]\n    arms:\n"
                                 "      a: {dropout: 0.1}\n      a: {dropout: 0.2}\n")
    _refused(capsys, work, ["sweep", "plan", "s.yaml"], "s.yaml", "duplicate key 'a'", "line 8", "first at line 7")


def test_duplicate_key_in_a_flow_mapping_and_merge_keys_still_work(work):
    (work / "f.yaml").write_text("x: {a: 1, a: 2}\n")
    with pytest.raises(LadderInputError, match="duplicate key 'a' at line 1"):
        read_yaml(work / "f.yaml")
    (work / "m.yaml").write_text("base: &b {x: 1, y: 1}\nm:\n  <<: *b\n  y: 2\n")
    assert read_yaml(work / "m.yaml") == {"base": {"x": 1, "y": 1}, "m": {"x": 1, "y": 2}}


# --- 9: a golden file that is not what `ladder nightly` reads -----------------------------------------------

@pytest.mark.parametrize(("content", "says"), [
    (b"null\n", "JSON object"),
    (b"5\n", "JSON object"),
    (b'"tolerances trials"\n', "JSON object"),
    (b"[]\n", "JSON object"),
    (b'{"tolerances": [], "trials": {}}\n', "tolerances: must be a JSON object"),
    (b'{"tolerances": {"bpb_abs": 0.01, "tokens_per_second_log_ratio": 0.9, "moe_rounds_abs": 0.05}, '
     b'"trials": {"b/L3/a/s0": {"bpb": {"web": "x"}, "tokens_per_second": 5, "moe_rounds_mean": 1}}}\n',
     "trials.b/L3/a/s0.bpb.web"),
    (b'{"tolerances": {"bpb_abs": 0.01, "tokens_per_second_log_ratio": 0.9, "moe_rounds_abs": 0.05}, '
     b'"trials": {"b/L3/a/s0": {"bpb": {"web": 3.0}, "tokens_per_second": 0, "moe_rounds_mean": 1}}}\n',
     "tokens_per_second"),
    (b'{"tolerances": {"bpb_abs": NaN, "tokens_per_second_log_ratio": 0.9, "moe_rounds_abs": 0.05}, "trials": {}}',
     "tolerances.bpb_abs: must be a finite number"),
    (b'{"tolerances": {"bpb_abs": 0.01, "tokens_per_second_log_ratio": 0.9, "moe_rounds_abs": 0.05}, '
     b'"trials": {"t": {"bpb": {"web": true}, "tokens_per_second": 5, "moe_rounds_mean": 1}}}', "must be a number"),
    (b'{"trials": {}}', "tolerances: missing"),
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_corrupt_golden_is_refused_before_anything_runs(work, capsys, content, says):
    (work / "g.json").write_bytes(content)
    _refused(capsys, work, ["nightly", "nightly", "--baseline", "g.json", "--out", "./out"], "g.json", says)


# --- 10: --out under a file -------------------------------------------------------------------------------------

def test_nightly_out_under_a_file_is_refused_before_ray(work, capsys):
    (work / "afile").write_text("")
    _refused(capsys, work, ["nightly", "nightly", "--out", "afile/sub"], "--out", "afile", "a file")


def test_nightly_update_baseline_where_no_golden_can_be_written_is_refused_before_ray(work, capsys):
    (work / "afile").write_text("")
    (work / "adir").mkdir()
    _refused(capsys, work, ["nightly", "nightly", "--update-baseline", "--baseline", "afile/g.json", "--out", "o"],
             "--baseline", "afile", "which is a file")
    _refused(capsys, work, ["nightly", "nightly", "--update-baseline", "--baseline", "adir", "--out", "o"],
             "--baseline", "adir is a directory, not a file")
    _refused(capsys, work, ["nightly", "nightly", "--out", "afile"], "--out", "afile is a file, not a directory")


# --- 11: a spec this machine cannot place, with no --address ----------------------------------------------------

def test_sweep_run_refuses_more_cpus_than_this_machine_before_ray(work, capsys, monkeypatch):
    monkeypatch.setattr(orchestrate, "check_ray_address", lambda address: None)  # no --address: it probes nothing
    (work / "big.yaml").write_text(BIG)
    capsys.readouterr()
    assert main(["sweep", "run", "big.yaml", "--tracking-uri", "sqlite:///s.db", "--new-store"]) == 2  # Ray: fails
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "resources" in err and "1000 CPU" in err and f"{os.cpu_count()} CPU in all" in err, err


def test_demo_refuses_more_cpus_than_this_machine_before_data(work, capsys, monkeypatch):
    import rungs.data.prepare as prepare

    monkeypatch.setattr(prepare, "ensure_prepared", lambda *a, **k: pytest.fail("data prepared before the check"))
    (work / "big.yaml").write_text(BIG)
    _refused(capsys, work, ["demo", "--spec", "big.yaml", "--out", "out"], "big.yaml", "1000 CPU")


def test_demo_missing_store_names_the_demo_command(work, capsys):
    line = _refused(capsys, work, ["demo", "--out", "out", "--tracking-uri", "sqlite:///typo/m.db"], "--new-store")
    assert "`ladder demo --tracking-uri sqlite:///typo/m.db --new-store`" in line and "sweep run" not in line


# --- 13b: `ladder train` checks its store as `ladder sweep run` does -----------------------------------------

def test_train_checks_the_tracking_server_before_data_or_run_files(work, capsys, monkeypatch):
    import ladder.run.stores as stores

    monkeypatch.setattr(stores, "SERVER_WAIT_SECONDS", 2.0)
    _refused(capsys, work, ["train", "cpu-demo", "--rung", "3", "--max-steps", "1",
                            "--tracking-uri", "http://127.0.0.1:9"], "--tracking-uri", "does not answer")


def test_train_refuses_a_store_uri_mlflow_cannot_read(work, capsys):
    _refused(capsys, work, ["train", "cpu-demo", "--rung", "3", "--max-steps", "1", "--tracking-uri", "foo://bar"],
             "--tracking-uri", "cannot read a store with this scheme")
