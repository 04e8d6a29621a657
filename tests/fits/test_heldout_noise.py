"""fits.heldout_noise against seeds drawn from a known model: a seed's effect on the whole domain (σ_m) and
on each document (σ_i), and against what more held-out documents actually do to the scatter."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fits.heldout_noise import split_domain, split_mean_over_domains, split_runs


def draw(rng: np.random.Generator, seeds: int, difficulty: np.ndarray, sd_docs: np.ndarray,
         sd_model: float) -> np.ndarray:
    """Bits of `seeds` models on documents of mean bits `difficulty`: b_si = difficulty_i·exp(m_s + u_si)."""
    m = rng.normal(0.0, sd_model, (seeds, 1))
    u = rng.normal(0.0, 1.0, (seeds, difficulty.size)) * sd_docs
    return difficulty * np.exp(m + u)


def documents(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n documents of lognormal length (bits) and per-document interaction sd 0.5-4%: long documents and
    short, as a held-out set has."""
    return rng.lognormal(8.0, 1.0, n), rng.uniform(0.005, 0.04, n)


def test_the_split_recovers_the_model_and_the_documents_parts():
    rng = np.random.default_rng(1)
    difficulty, sd_docs = documents(rng, 30)
    w = difficulty / difficulty.sum()
    want_docs = math.sqrt(float(w ** 2 @ sd_docs ** 2))
    for sd_model in (0.0, 0.004, 0.01):
        got = split_domain(draw(rng, 4000, difficulty, sd_docs, sd_model))
        assert got.seeds == 4000 and got.documents == 30
        assert got.sd_documents == pytest.approx(want_docs, rel=0.05), sd_model
        assert got.sd_total == pytest.approx(math.hypot(sd_model, want_docs), rel=0.05), sd_model
        if sd_model:
            assert got.sd_model == pytest.approx(sd_model, rel=0.07), sd_model
        else:
            assert got.documents_share > 0.85


def test_its_prediction_for_more_documents_is_what_more_documents_give():
    """The claim the split makes: with k times the held-out documents, drawn like these, one seed's sd is
    sqrt(model² + documents²/k). Checked against seeds scored on k copies of the set's documents (the same
    lengths and interaction sds, each copy's interactions drawn afresh)."""
    rng = np.random.default_rng(2)
    difficulty, sd_docs = documents(rng, 100)
    split = split_domain(draw(rng, 3000, difficulty, sd_docs, 0.003))
    assert 0.3 < split.documents_share < 0.9  # both parts matter here
    for k in (2, 4):
        larger = split_domain(draw(rng, 3000, np.tile(difficulty, k), np.tile(sd_docs, k), 0.003))
        assert split.sd_with_documents(k) == pytest.approx(larger.sd_total, rel=0.05), k
        assert split.sd_with_documents(k) < split.sd_total


def test_the_mean_over_domains_adds_the_domains_document_parts_over_d_squared():
    rng = np.random.default_rng(3)
    shared = rng.normal(0.0, 0.003, (3000, 1))  # a seed's effect on every domain alike
    domains = {}
    want = 0.0
    for name in ("a", "b", "c"):
        difficulty, sd_docs = documents(rng, 25)
        domains[name] = draw(rng, 3000, difficulty, sd_docs, 0.002) * np.exp(shared)
        w = difficulty / difficulty.sum()
        want += float(w ** 2 @ sd_docs ** 2) / 9
    got = split_mean_over_domains(domains)
    assert got.sd_documents == pytest.approx(math.sqrt(want), rel=0.05)
    # the model part: the shared 0.3% and each domain's own 0.2% over 3 domains
    assert got.sd_model == pytest.approx(math.sqrt(0.003 ** 2 + 0.002 ** 2 / 3), rel=0.07)


def test_runs_are_split_per_domain_and_in_the_mean():
    rng = np.random.default_rng(4)
    difficulty, sd_docs = documents(rng, 12)
    bits = draw(rng, 5, difficulty, sd_docs, 0.005)
    evals = [{"x": list(row), "y": list(row[::-1])} for row in bits]
    out = split_runs(evals)
    assert sorted(out) == ["all", "x", "y"]
    assert out["x"] == split_domain(bits)
    assert out["all"].seeds == 5 and out["all"].documents == 24


def test_configurations_of_two_seeds_each_pool_to_the_split_of_one():
    """Arms of a sweep, two seeds each, each arm a little better or worse on every document: centred on
    their own means and pooled, they give the split that many seeds of one configuration give."""
    rng = np.random.default_rng(6)
    difficulty, sd_docs = documents(rng, 30)
    w = difficulty / difficulty.sum()
    pairs = [draw(rng, 2, difficulty * rng.lognormal(0, 0.05, 30), sd_docs, 0.004) for _ in range(3000)]
    got = split_domain(pairs)
    assert got.seeds == 6000
    assert got.sd_documents == pytest.approx(math.sqrt(float(w ** 2 @ sd_docs ** 2)), rel=0.05)
    assert got.sd_model == pytest.approx(0.004, rel=0.07)
    evals = [{"x": list(row), "y": list(row)} for pair in pairs[:50] for row in pair]
    labels = [i for i in range(50) for _ in range(2)]
    assert split_runs(evals, groups=labels)["x"] == split_domain(pairs[:50])
    assert split_runs(evals, groups=labels)["all"].seeds == 100


def test_bad_input_is_refused_with_its_reason():
    rng = np.random.default_rng(5)
    bits = draw(rng, 4, *documents(rng, 6), 0.01)
    with pytest.raises(ValueError, match="at least 2 degrees of freedom"):
        split_domain(bits[:2])
    with pytest.raises(ValueError, match="at least 2 degrees of freedom"):
        split_domain([bits[:2], bits[2:3]])  # a single seed adds nothing
    with pytest.raises(ValueError, match="at least 3 held-out documents"):
        split_domain(bits[:, :2])
    with pytest.raises(ValueError, match="finite and positive"):
        split_domain(np.where(np.arange(6) == 2, 0.0, bits))
    with pytest.raises(ValueError, match="seeds x documents"):
        split_domain(bits[0])
    with pytest.raises(ValueError, match="different numbers of documents"):
        split_runs([{"x": list(row)} for row in bits[:3]] + [{"x": list(bits[3, :5])}])
    with pytest.raises(ValueError, match="different domains"):
        split_runs([{"x": list(row)} for row in bits[:3]] + [{"y": list(bits[3])}])
    with pytest.raises(ValueError, match="group labels"):
        split_runs([{"x": list(row)} for row in bits], groups=["a", "b"])
    with pytest.raises(ValueError, match="same held-out documents"):
        split_domain([bits[:2], bits[2:, :5]])
    with pytest.raises(ValueError, match="same seeds"):
        split_mean_over_domains({"x": bits, "y": bits[:3]})


def test_on_the_demo_corpus_the_held_out_documents_are_a_few_percent_of_the_seed_noise():
    """sweeps/heldout_noise.yaml's 24 runs (notebooks/fixtures/heldout_noise_doc_bits.json): the demo corpus on
    8 seeds at L2-L3 and 4 at L4-L5 of cpu-demo-d2. In the mean over domains the held-out documents are 1-3%
    of one seed's variance of log BPB at every rung, so four times the documents would lower its sd by about
    1%: the noise is the models'. Per domain their share reaches 52% (math at L5, 18 documents)."""
    import json
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[2] / "notebooks" / "fixtures" / "heldout_noise_doc_bits.json"
    doc = json.loads(fixture.read_text())
    runs = doc["runs"]
    for run in runs:  # the fixture is what the runs measured: each domain's BPB is its documents' bits over bytes
        for d, bits in run["doc_bits"].items():
            assert sum(bits) / sum(doc["doc_bytes"][d]) == pytest.approx(run["bpb"][d], rel=1e-6)
    want = {2: (8, 0.478, 0.078), 3: (8, 0.793, 0.081), 4: (4, 0.412, 0.075), 5: (4, 0.647, 0.105)}  # %, docs/science.md
    shares = []
    for rung, (seeds, sd_total, sd_documents) in want.items():
        split = split_runs([r["doc_bits"] for r in runs if r["rung"] == rung])
        mean = split["all"]
        assert mean.seeds == seeds and mean.documents == 209
        assert 100 * mean.sd_total == pytest.approx(sd_total, abs=5e-4)
        assert 100 * mean.sd_documents == pytest.approx(sd_documents, abs=5e-4)
        assert mean.documents_share < 0.035 and mean.sd_with_documents(4) / mean.sd_total > 0.985
        shares += [h.documents_share for d, h in split.items() if d != "all"]
    assert max(shares) == pytest.approx(0.52, abs=0.005)
