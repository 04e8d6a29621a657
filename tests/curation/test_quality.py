"""curation.quality: a hashed 1-2-gram logistic regression, its held-out AUC, and a pickle-free save format."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split

from curation.quality import HashingSettings, QualityModel, train_quality_classifier

CORPUS = Path(__file__).resolve().parents[2] / "rungs" / "data" / "demo" / "corpus"
SMALL = HashingSettings(n_features=2**16, max_chars=4000)  # small and fast; the defaults are 2^20 and 20,000


def demo_texts(source: str, n: int) -> list[str]:
    with gzip.open(CORPUS / f"{source}.jsonl.gz", "rt") as f:
        return [json.loads(line)["text"] for line in itertools.islice(f, n)]


@pytest.fixture(scope="module")
def demo_split() -> tuple[list[str], list[str]]:
    """Edited reference text (SciPy and SymPy docs, Gutenberg) against mailing-list replies."""
    return demo_texts("stem", 30) + demo_texts("books", 15) + demo_texts("math", 15), demo_texts("qa", 60)


@pytest.fixture(scope="module")
def demo_model(demo_split) -> QualityModel:
    return train_quality_classifier(*demo_split, seed=0, settings=SMALL)


def test_separates_the_demo_split_on_held_out_documents(demo_model, demo_split):
    assert demo_model.heldout_auc >= 0.9
    assert demo_model.counts == {"train_positive": 48, "train_negative": 48, "heldout_positive": 12,
                                 "heldout_negative": 12}
    pos, neg = demo_split
    s = demo_model.score(pos[:5] + neg[:5])
    assert s.dtype == np.float64 and ((0 <= s) & (s <= 1)).all()


def sklearn_split(demo_split):
    """(texts, labels, training rows, held-out rows): scikit-learn's own stratified split at seed 0."""
    pos, neg = demo_split
    texts = pos + neg
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    train, held = train_test_split(np.arange(len(texts)), test_size=0.2, stratify=y, random_state=0)
    return texts, y, np.sort(train), np.sort(held)


def test_score_is_sklearn_predict_proba_of_the_same_fit(demo_model, demo_split):
    texts, y, train, held = sklearn_split(demo_split)
    vec = SMALL.vectorizer()
    clf = LogisticRegression(C=10.0, max_iter=1000).fit(vec.transform([texts[i][:4000] for i in train]), y[train])
    expected = clf.predict_proba(vec.transform([texts[i][:4000] for i in held]))[:, 1]
    np.testing.assert_allclose(demo_model.score([texts[i] for i in held]), expected, rtol=1e-9, atol=1e-12)
    assert demo_model.heldout_auc == pytest.approx(roc_auc_score(y[held], expected))


def test_deterministic(demo_model, demo_split):
    again = train_quality_classifier(*demo_split, seed=0, settings=SMALL)
    np.testing.assert_array_equal(again.coef_index, demo_model.coef_index)
    np.testing.assert_array_equal(again.coef_value, demo_model.coef_value)
    assert again.heldout_auc == demo_model.heldout_auc


def test_save_and_load_round_trip_without_pickle(demo_model, demo_split, tmp_path):
    path = demo_model.save(tmp_path / "model")
    assert sorted(p.name for p in path.iterdir()) == ["folds", "model.json", "trained.npz", "weights.npz"]
    assert sorted(p.name for p in (path / "folds").iterdir()) == ["0", "1", "2", "3", "4"]
    with np.load(path / "weights.npz", allow_pickle=False) as w:
        assert {k: w[k].dtype.kind for k in w.files} == {"coef_index": "i", "coef_value": "f", "intercept": "f"}
    loaded = QualityModel.load(path)
    texts = demo_split[0][:4] + demo_split[1][:4] + demo_split[0][-4:]  # training texts and held-out ones
    np.testing.assert_array_equal(loaded.score(texts), demo_model.score(texts))
    assert len(loaded.folds) == 5
    assert loaded.heldout_auc == demo_model.heldout_auc and loaded.settings == SMALL


def test_training_texts_are_scored_out_of_fold_as_sklearn_cross_fits_them(demo_model, demo_split):
    """Each training text gets the score of a model fitted without its fold (StratifiedKFold, 5 folds, seeded),
    not the in-sample score of the model that saw it; texts it was not trained on keep the main model's."""
    from sklearn.model_selection import StratifiedKFold

    texts, y, train, held = sklearn_split(demo_split)
    vec = SMALL.vectorizer()
    features = vec.transform([texts[i][:4000] for i in train])
    expected = np.empty(len(train))
    for rest, own in StratifiedKFold(5, shuffle=True, random_state=0).split(train, y[train]):
        clf = LogisticRegression(C=10.0, max_iter=1000).fit(features[rest], y[train][rest])
        expected[own] = clf.predict_proba(features[own])[:, 1]
    got = demo_model.score([texts[i] for i in train])
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
    in_sample = LogisticRegression(C=10.0, max_iter=1000).fit(features, y[train]).predict_proba(features)[:, 1]
    # the in-sample scores sit further from the middle: positives higher, negatives lower
    assert np.mean(np.abs(in_sample - 0.5)) > np.mean(np.abs(got - 0.5))


def test_word_bigrams_carry_signal_unigrams_cannot():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30)]

    def doc(order: tuple[str, str]) -> str:  # the same words in both classes; only "alpha beta"'s order differs
        return f"{' '.join(rng.choice(words, size=6))} {order[0]} {order[1]} {' '.join(rng.choice(words, size=6))}"

    pos = [doc(("alpha", "beta")) for _ in range(60)]
    neg = [doc(("beta", "alpha")) for _ in range(60)]
    assert train_quality_classifier(pos, neg, seed=1, settings=SMALL).heldout_auc == 1.0
    unigrams = HashingSettings(n_features=2**16, ngram_max=1)
    assert train_quality_classifier(pos, neg, seed=1, settings=unigrams).heldout_auc < 0.8


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(ValueError, match="positive_texts"):
        train_quality_classifier([], ["a b", "c d", "e f"], seed=0)
    with pytest.raises(ValueError, match="negative_texts"):
        train_quality_classifier(["a b"] * 5, ["c d", 3, "e"], seed=0)
    with pytest.raises(ValueError, match="heldout_fraction"):
        train_quality_classifier(["a b"] * 5, ["c d"] * 5, seed=0, heldout_fraction=1.0)
    with pytest.raises(ValueError, match="positive_texts"):
        train_quality_classifier("not a list", ["c d"] * 5, seed=0)
    with pytest.raises(ValueError, match="not a saved quality model"):
        QualityModel.load(tmp_path)


def test_a_save_that_fails_midway_leaves_a_whole_model_or_none(demo_model, tmp_path, monkeypatch):
    """A save killed or out of disk while writing model.json (after the weights) over an older model: never a
    half-written model.json, nor the old model.json over the new weights; `load` refuses the directory until a
    save finishes (and a resumed curate then trains again)."""
    import builtins
    import errno
    import io

    path = tmp_path / "model"
    older = QualityModel(SMALL, np.array([1, 2]), np.array([0.5, -0.5]), 0.1, 0.6, {"train_positive": 1})
    older.save(path)
    (path / "notes.txt").write_text("mine")  # a file save did not write: never removed
    real_open = builtins.open

    class HalfWritten:
        """A file whose write stops halfway through, as when the disk fills or the process is killed."""

        def __init__(self, f) -> None:
            self.f = f

        def write(self, data) -> int:
            self.f.write(data[:len(data) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.f.close()

        def __getattr__(self, name):
            return getattr(self.f, name)

    def failing_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return HalfWritten(f) if "w" in mode and "model.json" in str(file) else f

    with monkeypatch.context() as m:
        m.setattr(builtins, "open", failing_open)
        m.setattr(io, "open", failing_open)
        with pytest.raises(OSError):
            demo_model.save(path)
    with pytest.raises(ValueError, match="has no model.json and weights.npz: not a saved quality model"):
        QualityModel.load(path)
    assert not [p for p in path.iterdir() if p.name.startswith(".")]  # no temporary left
    loaded = QualityModel.load(demo_model.save(path))
    np.testing.assert_array_equal(loaded.coef_value, demo_model.coef_value)
    assert loaded.heldout_auc == demo_model.heldout_auc
    assert (path / "notes.txt").read_text() == "mine"


def test_a_model_saved_over_another_keeps_none_of_its_out_of_fold_models(demo_model, tmp_path):
    path = demo_model.save(tmp_path / "model")
    plain = QualityModel(demo_model.settings, demo_model.coef_index, demo_model.coef_value, demo_model.intercept,
                         demo_model.heldout_auc, demo_model.counts)
    plain.save(path)  # no folds: its trained.npz is written empty, not left as the first model's
    assert QualityModel.load(path).folds == []
