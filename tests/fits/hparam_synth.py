"""Synthetic sweeps generated from the report's laws, for the surface → law pipeline tests."""

import numpy as np
import pandas as pd

REPORT = {"coef": 17.04, "k": -1.0, "a": -1.51, "b": 0.175, "c": -0.573}


def true_optimum(steps, tpp):
    log_lr = REPORT["a"] + REPORT["b"] * np.log(tpp) + REPORT["c"] * np.log(steps)
    log_prod = np.log(REPORT["coef"]) + REPORT["k"] * np.log(steps)
    return log_lr, log_prod


def sweep(seed=0, noise=2e-4, sizes=(1e7, 3e7, 1e8, 3e8, 1e9), tpps=(5.0, 20.0, 80.0), dropout_law=None):
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        for tpp in tpps:
            tokens = tpp * n
            steps = int(np.ceil(tokens / (0.58 * tokens**0.571)))
            u0, v0 = true_optimum(steps, tpp)
            offs = rng.uniform(-0.3, 0.3, 2)  # the grid is not centred on the optimum
            p_star = dropout_law(n) if dropout_law else None
            dropouts = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3) if dropout_law else (0.0,)
            for du in np.linspace(-1.4, 1.4, 5) + offs[0]:
                for dv in np.linspace(-1.4, 1.4, 5) + offs[1]:
                    for p in dropouts:
                        y = 1.0 + 0.02 * du**2 + 0.015 * dv**2 + 0.01 * du * dv
                        if p_star is not None:
                            y += 0.5 * (p - p_star) ** 2
                        rows.append({"run_id": f"n{n:g}-t{tpp:g}-{len(rows)}", "lr": np.exp(u0 + du),
                                     "wd": np.exp(v0 + dv - (u0 + du)), "steps": steps, "tpp": tpp,
                                     "params_active": n, "dropout": p, "bpb": y + rng.normal(0, noise)})
    return pd.DataFrame(rows)
