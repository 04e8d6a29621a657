"""Where the seed noise of the demo ladder's runs comes from, and what changes it, on the committed fixtures of
the sweeps that measure it (docs/science.md, "Data recipes on the ladder"): the LR decayed to zero, the
initialisation and the data order apart, the routing taken out, fewer tokens a parameter, four times the
weight decay, paired data arms in a keyed data order. One seed's scatter of
log BPB and the law's local slope, read with numpy and scipy from the runs' own BPB."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "notebooks" / "fixtures"
CALIBRATION = FIXTURES / "data_curation_calibration_runs.csv"  # sweeps/data_curation_calibration.yaml
DOMAINS = ("books", "code", "math", "qa", "stem", "web")


def mean_log_bpb(table):
    """Each run's log BPB, the mean over the demo's six domains."""
    import numpy as np

    return np.mean([np.log(table[f"bpb_{d}"]) for d in DOMAINS], axis=0)


SCHEDULE = FIXTURES / "seed_noise_schedule_runs.csv"  # sweeps/seed_noise_schedule.yaml: LR decayed to 0


def test_decaying_the_lr_to_zero_leaves_the_seed_noise_as_it_was():
    """The same data, rungs and eight seeds, the cosine ending at 0 instead of a tenth of the peak: one seed's
    scatter of log BPB (mean over domains) is the same within an F-test's 95% range at L2 and L3, and each
    seed's BPB moves with the seed under both schedules (correlation ≥ 0.85): the noise is set early, by the
    initialisation and the data order, not by the last steps' batches."""
    import numpy as np
    import pandas as pd
    from scipy import stats


    def log_bpb(path: Path) -> pd.DataFrame:
        runs = pd.read_csv(path)
        runs["log_bpb"] = mean_log_bpb(runs)
        return runs

    tenth, zero = log_bpb(CALIBRATION), log_bpb(SCHEDULE)
    expected_sd = {2: (0.444, 0.422), 3: (0.865, 0.909)}  # % (min_lr_ratio 0.1, 0), docs/science.md
    for rung, (sd_tenth, sd_zero) in expected_sd.items():
        a = tenth[tenth.rung == rung].set_index("seed").log_bpb.sort_index()
        b = zero[zero.rung == rung].set_index("seed").log_bpb.sort_index()
        assert list(a.index) == list(b.index) == list(range(8))
        assert 100 * a.std() == pytest.approx(sd_tenth, abs=5e-4) and 100 * b.std() == pytest.approx(sd_zero, abs=5e-4)
        low, high = stats.f.ppf([0.025, 0.975], 7, 7)
        assert low < a.var() / b.var() < high, rung
        assert np.corrcoef(a, b)[0, 1] >= 0.85, rung
        assert b.mean() > a.mean()  # decaying to zero costs BPB at these rungs (+0.6% at L2, +1.0% at L3)


SOURCES = FIXTURES / "seed_noise_sources_runs.csv"  # sweeps/seed_noise_sources.yaml: init and order apart


def test_the_seed_noise_is_part_initialisation_and_part_data_order():
    """The baseline's data at L2-L3 on six initialisations in one data order (`data_seed` 100) and on one
    initialisation (seed 0) in six orders: one seed's scatter of log BPB (mean over domains) is 0.23% and
    0.37% from the weights, 0.41% and 0.35% from the order; their sum is what eight seeds varying both measured
    (0.44%, 0.86%; within an F-test's 95% range at both rungs), and the initialisation's share, pooled, is 39%:
    pairing arms on their initial weights leaves the order's 0.38% between them."""
    import pandas as pd
    from scipy import stats

    runs, both = pd.read_csv(SOURCES), pd.read_csv(CALIBRATION)
    for table in (runs, both):
        table["log_bpb"] = mean_log_bpb(table)
    expected = {2: (0.227, 0.410), 3: (0.369, 0.347)}  # % (init, order), docs/science.md
    var_init = var_order = 0.0
    for rung, (sd_init, sd_order) in expected.items():
        init = runs[(runs.rung == rung) & (runs.data_seed == 100)]
        order = runs[(runs.rung == rung) & (runs.seed == 0)]
        assert sorted(init.seed) == list(range(6)) and sorted(order.data_seed) == list(range(100, 106))
        assert 100 * init.log_bpb.std() == pytest.approx(sd_init, abs=5e-4)
        assert 100 * order.log_bpb.std() == pytest.approx(sd_order, abs=5e-4)
        var_init, var_order = var_init + init.log_bpb.var() / 2, var_order + order.log_bpb.var() / 2
        eight = both[both.rung == rung].log_bpb
        low, high = stats.f.ppf([0.025, 0.975], len(eight) - 1, 10)
        assert low < eight.var() / (init.log_bpb.var() + order.log_bpb.var()) < high, rung
    assert 100 * math.sqrt(var_order) == pytest.approx(0.380, abs=5e-4)
    assert var_init / (var_init + var_order) == pytest.approx(0.39, abs=0.005)


ROUTING = FIXTURES / "seed_noise_routing_runs.csv"  # sweeps/seed_noise_routing.yaml: 8 experts top 2 or 2 top 2


def test_the_routing_choices_are_not_where_the_seed_noise_is():
    """The demo corpus on six seeds at L2-L4, routed (the recipe's 2 of 8 experts) and unrouted (2 experts, top
    2: every token through both; the same rungs, tokens, LR and WD): one seed's scatter of log BPB (mean over
    domains), each arm's centred on its rungs and pooled, is 0.62% routed and 0.50% unrouted on 15 degrees of
    freedom each, an F-test p of 0.43: no measured difference. Unrouted, the law is flatter too (local slope
    0.071 against 0.079 over L2-L4; BPB +1.8% at L4), so noise over slope, what sets an EG interval's width, is
    0.071 against 0.078: taking the routing out does not buy a 2-seed calibration."""
    import numpy as np
    import pandas as pd
    from scipy import stats

    runs = pd.read_csv(ROUTING)
    assert len(runs) == 36 and set(runs.arm) == {"routed", "unrouted"}
    settings = runs.groupby(["rung", "arm"])[["lr", "wd", "steps", "tokens"]].first().unstack("arm")
    for column in ("lr", "wd", "steps", "tokens"):  # the arms differ in their routing alone
        assert (settings[column]["routed"] == settings[column]["unrouted"]).all(), column
    runs["log_bpb"] = mean_log_bpb(runs)
    cells = runs.groupby(["arm", "rung"]).log_bpb
    expected = {"routed": (0.536, 0.756, 0.543), "unrouted": (0.412, 0.717, 0.278)}  # %, docs/science.md
    for arm, sds in expected.items():
        assert [round(100 * cells.std()[arm][r], 3) for r in (2, 3, 4)] == list(sds), arm
    deviation = runs.log_bpb - cells.transform("mean")
    pooled = {arm: math.sqrt((deviation[runs.arm == arm] ** 2).sum() / 15) for arm in expected}
    assert 100 * pooled["routed"] == pytest.approx(0.620, abs=5e-4)
    assert 100 * pooled["unrouted"] == pytest.approx(0.504, abs=5e-4)
    ratio = (pooled["routed"] / pooled["unrouted"]) ** 2
    assert 2 * min(stats.f.sf(ratio, 15, 15), stats.f.cdf(ratio, 15, 15)) == pytest.approx(0.43, abs=0.005)
    mean = cells.mean()
    flops = runs.groupby(["arm", "rung"]).train_flops.mean()
    slope = {arm: -np.polyfit(np.log(flops[arm].to_numpy()), mean[arm].to_numpy(), 1)[0] for arm in expected}
    assert slope["routed"] == pytest.approx(0.0795, abs=5e-4) and slope["unrouted"] == pytest.approx(0.0713, abs=5e-4)
    assert pooled["routed"] / slope["routed"] == pytest.approx(0.078, abs=5e-4)
    assert pooled["unrouted"] / slope["unrouted"] == pytest.approx(0.071, abs=5e-4)
    assert 100 * math.expm1(mean["unrouted"][4] - mean["routed"][4]) == pytest.approx(1.81, abs=0.005)


TPP10 = FIXTURES / "seed_noise_tpp_runs.csv"  # sweeps/seed_noise_tpp.yaml: the demo corpus at TPP 10


def test_a_third_of_the_tokens_per_parameter_leaves_noise_over_slope_as_it_was():
    """Six seeds at L2-L4 at TPP 10 (the recipe's is 30): one seed's scatter of log BPB, pooled over the rungs,
    is 0.41% (15 dof) and the local slope 0.053, so noise over slope is 0.076, the routed recipe's 0.078."""
    import numpy as np
    import pandas as pd

    runs = pd.read_csv(TPP10)
    assert len(runs) == 18 and set(runs.tpp) == {10} and sorted(runs.groupby("rung").seed.nunique()) == [6, 6, 6]
    runs["log_bpb"] = mean_log_bpb(runs)
    cells = runs.groupby("rung").log_bpb
    assert [round(100 * cells.std()[r], 3) for r in (2, 3, 4)] == [0.401, 0.393, 0.426]
    pooled = math.sqrt(((runs.log_bpb - cells.transform("mean")) ** 2).sum() / 15)
    flops = runs.groupby("rung").train_flops.mean()
    slope = -np.polyfit(np.log(flops.to_numpy()), cells.mean().to_numpy(), 1)[0]
    assert 100 * pooled == pytest.approx(0.407, abs=5e-4) and slope == pytest.approx(0.0534, abs=5e-4)
    assert pooled / slope == pytest.approx(0.076, abs=5e-4)


WD4 = FIXTURES / "seed_noise_wd_runs.csv"  # sweeps/seed_noise_wd.yaml: four times the recipe's weight decay


def test_four_times_the_weight_decay_leaves_each_seeds_scatter_where_it_was():
    """Six seeds at L2-L4 at four times the recipe's weight decay, the LR unchanged (LR·WD·steps ~1 instead of
    ~0.26, so the initial weights decay to a third, not three quarters): one seed's scatter of log BPB, pooled
    over the rungs, is 0.59% against the recipe's 0.62% on the same seeds (routing fixture's routed arm), the
    slope 0.079 as it was, noise over slope 0.075 against 0.078. Each seed lands where it did at the recipe's
    weight decay (its deviation from the rung's mean correlates 0.97 between the two): the scatter is set by the
    seed, not held by weights that weight decay has not yet erased."""
    import numpy as np
    import pandas as pd
    from scipy import stats

    wd4 = pd.read_csv(WD4)
    recipe = pd.read_csv(ROUTING).query("arm == 'routed'")
    assert len(wd4) == 18 and sorted(wd4.groupby("rung").seed.nunique()) == [6, 6, 6]
    settings = {name: table.groupby("rung")[["lr", "wd", "steps", "tokens"]].first() for name, table in
                (("wd4", wd4), ("recipe", recipe))}
    for column in ("lr", "steps", "tokens"):  # the weight decay alone differs
        assert (settings["wd4"][column] == settings["recipe"][column]).all(), column
    assert np.allclose(settings["wd4"]["wd"] / settings["recipe"]["wd"], 4.0, rtol=1e-6)
    read = {}
    for name, table in (("wd4", wd4), ("recipe", recipe)):
        log_bpb = pd.Series(mean_log_bpb(table),
                            index=pd.MultiIndex.from_arrays([table.rung, table.seed])).sort_index()
        deviation = log_bpb - log_bpb.groupby(level="rung").transform("mean")
        pooled = math.sqrt((deviation ** 2).sum() / 15)
        flops = table.groupby("rung").train_flops.mean()
        slope = -np.polyfit(np.log(flops.to_numpy()), log_bpb.groupby(level="rung").mean().to_numpy(), 1)[0]
        read[name] = (log_bpb, deviation, pooled, slope)
    (log_wd4, dev_wd4, pooled_wd4, slope_wd4), (log_recipe, dev_recipe, pooled_recipe, slope_recipe) = (
        read["wd4"], read["recipe"])
    assert [round(100 * log_wd4[r].std(), 3) for r in (2, 3, 4)] == [0.540, 0.765, 0.418]
    assert 100 * pooled_wd4 == pytest.approx(0.592, abs=5e-4) and slope_wd4 == pytest.approx(0.0788, abs=5e-4)
    assert pooled_wd4 / slope_wd4 == pytest.approx(0.075, abs=5e-4)
    assert pooled_recipe / slope_recipe == pytest.approx(0.078, abs=5e-4)
    ratio = (pooled_recipe / pooled_wd4) ** 2
    assert 2 * min(stats.f.sf(ratio, 15, 15), stats.f.cdf(ratio, 15, 15)) == pytest.approx(0.86, abs=0.005)
    assert list(dev_wd4.index) == list(dev_recipe.index)
    assert np.corrcoef(dev_wd4, dev_recipe)[0, 1] == pytest.approx(0.97, abs=0.005)
    cost = np.expm1(log_wd4.groupby(level="rung").mean() - log_recipe.groupby(level="rung").mean())
    assert [round(100 * c, 2) for c in cost] == [0.06, 0.42, 0.21]  # % BPB at L2, L3, L4


ORDER = FIXTURES / "seed_noise_order_runs.csv"  # sweeps/seed_noise_order.yaml: paired arms in two data orders


def test_a_keyed_data_order_does_not_make_paired_data_arms_quieter():
    """The baseline, dedup, quality and random90 (a blind nine tenths of every source) on six seeds at L2-L3, the
    data order a seeded permutation of each subset or keyed by document id. Paired on the seed (the same initial
    weights; keyed, the documents two arms share in one order), one seed's difference of log BPB (mean over
    domains) between arm and baseline scatters by 0.61% pooled over the arms in the permutation and 0.65% keyed,
    against 0.77% and 1.00% unpaired: pairing on the seed buys a fifth to a third, and the keyed order no more
    (dedup quieter, quality and random90 noisier). Two seeds a side paired would still be ±12%, not ±10%."""
    import numpy as np
    import pandas as pd

    runs = pd.read_csv(ORDER)
    assert len(runs) == 104 and set(runs.data_order) == {"permutation", "keyed"}
    assert (runs.arm.str.startswith("keyed_") == (runs.data_order == "keyed")).all()
    settings = runs.groupby("rung")[["lr", "wd", "steps", "tokens"]].nunique()
    assert (settings == 1).all().all()  # every arm and order trains each rung alike
    runs["log_bpb"] = mean_log_bpb(runs)
    runs["data"] = runs.arm.str.replace("keyed_", "")
    expected = {  # % (paired, unpaired), pooled over L2 and L3, six seeds each
        ("permutation", "dedup"): (0.679, 0.826), ("permutation", "quality"): (0.421, 0.765),
        ("permutation", "random90"): (0.701, 0.727), ("keyed", "dedup"): (0.397, 0.927),
        ("keyed", "quality"): (0.566, 0.908), ("keyed", "random90"): (0.879, 1.135)}
    read = {}
    for (order, arm), sds in expected.items():
        paired, unpaired = [], []
        for rung in (2, 3):
            table = runs[(runs.data_order == order) & (runs.rung == rung)].pivot_table(
                index="seed", columns="data", values="log_bpb")
            assert list(table.index) == list(range(6))
            paired.append((table[arm] - table["baseline"]).var())
            unpaired.append(table[arm].var() + table["baseline"].var())
        read[order, arm] = (math.sqrt(np.mean(paired)), math.sqrt(np.mean(unpaired)))
        assert [round(100 * v, 3) for v in read[order, arm]] == list(sds), (order, arm)
    pooled = {order: [math.sqrt(np.mean([read[order, arm][k] ** 2 for arm in ("dedup", "quality", "random90")]))
                      for k in (0, 1)] for order in ("permutation", "keyed")}
    assert [round(100 * v, 2) for v in pooled["permutation"]] == [0.61, 0.77]
    assert [round(100 * v, 2) for v in pooled["keyed"]] == [0.65, 1.0]
    from scipy import stats

    t = stats.t.ppf(0.975, 30)
    half_width = {order: math.expm1(t * pooled[order][0] / math.sqrt(2) / 0.0795) for order in pooled}
    assert round(100 * half_width["permutation"], 1) == 11.8 and round(100 * half_width["keyed"], 1) == 12.4
