"""L = E + A/N^η + B/D^η fitted jointly over several token multipliers."""

import numpy as np
import pandas as pd
import pytest

from fits.chinchilla import fit_chinchilla
from fits.shared_exponent import fit_shared_exponent


def over_trained(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    N = np.repeat(np.geomspace(1e7, 1.4e9, 7), 5)
    D = N * np.tile([20.0, 40.0, 80.0, 160.0, 320.0], 7)  # token multipliers, Chinchilla-optimal and beyond
    L = (1.9 + 300.0 / N**0.3 + 900.0 / D**0.3) * np.exp(rng.normal(0, 0.003, len(N)))
    return pd.DataFrame({"params": N, "tokens": D, "loss": L})


def test_recovers_the_shared_exponent_and_is_nested_in_the_free_fit():
    df = over_trained()
    shared = fit_shared_exponent(df, id_column=None)
    assert shared.params["alpha"] == shared.params["beta"] == pytest.approx(0.3, rel=0.1)
    assert shared.params["E"] == pytest.approx(1.9, rel=0.05)
    assert shared.extra["optimizer"]["converged"]
    free = fit_chinchilla(df, id_column=None)
    assert free.objective <= shared.objective * (1 + 1e-9)  # the free law contains the shared one


@pytest.mark.parametrize("n_starts", [0, -3, 2.5, True])
def test_a_start_count_that_is_not_a_count_is_refused(n_starts):
    from fits.errors import FitInputError

    with pytest.raises(FitInputError, match="n_starts must be a whole number"):
        fit_shared_exponent(over_trained(), id_column=None, n_starts=n_starts)


def test_cli_shared_exponent(tmp_path, capsys):
    import json

    from ladder.cli import main

    csv = tmp_path / "over.csv"
    over_trained().to_csv(csv, index=False)
    argv = ["fit", "chinchilla", "--csv", str(csv), "--n", "params", "--d", "tokens", "--y", "loss", "--shared-exponent"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["alpha"] == out["beta"] and out["options"]["shared_exponent"] and out["law"] == "chinchilla_shared_exponent"
    assert main([*argv, "--bootstrap", "10"]) == 2
