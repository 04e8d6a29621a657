"""Every figure renders to a PNG (the plotted numbers are the tested fits')."""

import numpy as np
import pandas as pd
import pytest

from fits.compute_laws import fit_power_laws
from fits.efficiency import efficiency_gains
from fits.hparam_laws import fit_hparam_laws
from fits.plots import plot_efficiency, plot_power_laws
from fits.power_law import fit_power_law
from tests.fits.hparam_synth import sweep

PNG = b"\x89PNG\r\n\x1a\n"


def test_power_law_figure_draws_a_band_only_where_the_law_has_an_interval(tmp_path):
    C = np.repeat(np.geomspace(1e18, 1e21, 5), 2)
    noise = np.exp(np.random.default_rng(0).normal(0, 0.002, len(C)))
    df = pd.DataFrame({"train_flops": C, "bpb": (0.6 + 30 * C**-0.08) * noise, "domain": "code"})
    fit = fit_power_law(df, bootstrap=100)
    assert fit.interval_note is None
    fig = plot_power_laws({"code": fit}, df, path=tmp_path / "pl.png")
    assert (tmp_path / "pl.png").read_bytes()[:8] == PNG
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "held-out rung" in labels and any("band" in t for t in labels)
    assert (fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()) == ("training FLOPs", "held-out BPB (bits per byte)")
    four = df[df.train_flops < C.max()]  # 4 distinct x: no interval (fits.bootstrap), so no band either
    fit4 = fit_power_law(four, bootstrap=100)
    assert fit4.interval_note and "4 distinct x" in fit4.interval_note
    fig = plot_power_laws({"code": fit4}, four)
    assert not any("band" in t.get_text() for t in fig.axes[0].get_legend().get_texts())


def test_extrapolation_figure_draws_the_law_and_its_band_out_to_the_target(tmp_path):
    from fits.plots import plot_extrapolation

    C = np.repeat(np.geomspace(1e18, 1e21, 5), 2)
    noise = np.exp(np.random.default_rng(0).normal(0, 0.002, len(C)))
    df = pd.DataFrame({"train_flops": C, "bpb": (0.6 + 30 * C**-0.08) * noise, "domain": "code"})
    fit = fit_power_laws(df, bootstrap=100).laws["code"]
    fig = plot_extrapolation({"code": fit}, 1e24, df, path=tmp_path / "ex.png", target_label="L102")
    assert (tmp_path / "ex.png").read_bytes()[:8] == PNG
    ax = fig.axes[0]
    assert ax.get_xlim()[1] >= 1e24 and "×1e+03 beyond the data" in ax.get_title()
    band = next(c for c in ax.collections if c.get_label() == "95% band")
    assert band.get_paths()[0].vertices[:, 0].max() >= 1e24  # the band reaches the target
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"L102: {float(fit.predict([1e24])[0]):.4g}, 95% prediction interval of one run (the card's)" in labels
    assert "runs" in labels


def test_extrapolation_figure_draws_at_the_target_the_interval_the_card_prints():
    """The card (`fits.extrapolate.bpb_from_law`) prints one new run's prediction interval at the target; the
    figure drew the law's bootstrap band there, about 3× narrower. Both are now the prediction interval."""
    from fits.extrapolate import bpb_from_law
    from fits.plots import plot_extrapolation

    C = np.repeat(np.geomspace(1e18, 1e21, 5), 2)
    noise = np.exp(np.random.default_rng(0).normal(0, 0.002, len(C)))
    df = pd.DataFrame({"train_flops": C, "bpb": (0.6 + 30 * C**-0.08) * noise, "domain": "code"})
    fit = fit_power_laws(df, bootstrap=100).laws["code"]
    for level in (0.95, 0.8):
        options = {} if level == 0.95 else {"level": level}  # the default is the card's level
        ax = plot_extrapolation({"code": fit}, 1e22, df, **options).axes[0]
        (segment,) = ax.containers[0].lines[2][0].get_segments()  # the errorbar's one vertical bar
        iv = fit.new_run_interval([1e22], level)
        assert segment[:, 0] == pytest.approx([1e22, 1e22])
        assert segment[:, 1] == pytest.approx([float(iv["lo"][0]), float(iv["hi"][0])], rel=1e-12)
        assert segment[:, 1] == pytest.approx(bpb_from_law(fit, 1e22, level)["interval"], rel=1e-12)
        band_lo, band_hi = fit.predict_interval([1e22], level)
        assert segment[1, 1] - segment[0, 1] > float(band_hi[0] - band_lo[0])  # not the law's band
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any(f"{level:.0%} prediction interval of one run" in t for t in labels)


def test_the_backtest_legend_names_its_own_level():
    from fits.backtest import holdout_backtest

    C = np.repeat(np.geomspace(1e18, 1e21, 7), 2)
    noise = np.exp(np.random.default_rng(0).normal(0, 0.002, len(C)))
    df = pd.DataFrame({"train_flops": C, "bpb": (0.6 + 30 * C**-0.08) * noise, "domain": "code"})
    backtest = holdout_backtest(df, bootstrap=100, ci_level=0.5, floor="fit")
    assert backtest["predictions"][0]["inside"]
    fig = plot_power_laws({"code": fit_power_law(df, bootstrap=100)}, df, backtests={"code": backtest})
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    predicted = next(t for t in labels if t.startswith("predicted without it"))
    assert predicted.endswith(", inside 50%")


def test_hparam_dropout_and_efficiency_figures(tmp_path):
    def truth(n):
        return 0.2 / (1 + np.exp(-(np.log(n) - np.log(1e8))))
    fit = fit_hparam_laws(sweep(seed=4, sizes=(1e6, 1e7, 1e8, 1e9, 1e10), tpps=(20.0,), dropout_law=truth))
    from fits.plots import plot_hparams

    paths = plot_hparams(fit, tmp_path / "hp.png")
    assert [p.name for p in paths] == ["hp_surfaces.png", "hp_laws.png", "hp_dropout.png"]
    assert all(p.read_bytes()[:8] == PNG for p in paths)
    rows = []
    for L, C in zip((18, 24, 30, 36, 42), (1e18, 1e19, 1e20, 1e21, 1e22)):
        rows += [{"arm": "baseline", "rung": L, "train_flops": C, "wall_seconds": C / 1e15, "bpb": 0.5 + 30 * C**-0.07},
                 {"arm": "agc", "rung": L, "train_flops": C, "wall_seconds": C / 1e15, "bpb": 0.5 + 30 * (1.1 * C)**-0.07}]
    eg = efficiency_gains(pd.DataFrame(rows), bootstrap=50)
    plot_efficiency(eg, tmp_path / "eg.png")
    assert (tmp_path / "eg.png").read_bytes()[:8] == PNG
