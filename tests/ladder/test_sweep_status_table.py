"""`ladder sweep status`'s table: a trial with nothing to show shows "-", not Python's None."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from ladder.cli import main


def test_pending_trials_show_a_dash_for_their_bpb_and_seconds(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    MlflowClient(uri).create_experiment("sweep-smoke")
    assert main(["sweep", "status", "smoke", "--tracking-uri", uri]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│") and "pending" in line]
    assert rows and all("None" not in line for line in rows)
    assert all([cell.strip() for cell in line.split("│")][5:7] == ["-", "-"] for line in rows)
