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
from sklearn.model_selection import StratifiedGroupKFold

from curation.exact import normalise
from curation.minhash import LSHParams, jaccard, shingle_sets
from curation.quality import HashingSettings, QualityModel, fingerprint, train_quality_classifier
from curation.quality_groups import near_duplicate_groups
from rungs.data.errors import DataInputError

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
    """(texts, labels, training rows, held-out rows, groups): scikit-learn's own stratified split by
    near-duplicate group at seed 0 (the first of five folds held out)."""
    pos, neg = demo_split
    texts = pos + neg
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    groups = near_duplicate_groups([t[:4000] for t in texts])
    train, held = next(StratifiedGroupKFold(5, shuffle=True, random_state=0).split(texts, y, groups))
    assert set(y[train]) == set(y[held]) == {0, 1}
    return texts, y, np.sort(train), np.sort(held), groups


def test_score_is_sklearn_predict_proba_of_the_same_fit(demo_model, demo_split):
    texts, y, train, held, _ = sklearn_split(demo_split)
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
    """Each training text gets the score of a model fitted without its fold (StratifiedGroupKFold over the
    near-duplicate groups, 5 folds, seeded), not the in-sample score of the model that saw it; texts it was not
    trained on keep the main model's."""
    texts, y, train, held, groups = sklearn_split(demo_split)
    vec = SMALL.vectorizer()
    features = vec.transform([texts[i][:4000] for i in train])
    expected = np.empty(len(train))
    for rest, own in StratifiedGroupKFold(5, shuffle=True, random_state=0).split(train, y[train], groups[train]):
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


# --- splits by near-duplicate group ------------------------------------------------------------------------------

VOCABULARY = [f"v{i}" for i in range(3000)]


def near_copies(rng: np.random.Generator, words: int, copies: int, changed: int) -> list[str]:
    """`copies` texts of one random `words`-word text, each with `changed` words replaced (Jaccard ~0.9 apart)."""
    base = rng.choice(VOCABULARY, size=words)
    out = []
    for _ in range(copies):
        text = base.copy()
        text[rng.choice(words, size=changed, replace=False)] = rng.choice(VOCABULARY, size=changed)
        out.append(" ".join(text))
    return out


def grouped_corpus(seed: int, n_groups: int = 200, copies: int = 5) -> tuple[list[str], list[str], list[int]]:
    """Positives and negatives whose labels are random per group of near-copies: nothing in a text says its
    label except its near-copies'. Returns (positives, negatives, the group of each text of positives + negatives)."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n_groups) % 2)
    pos, neg, pos_group, neg_group = [], [], [], []
    for g in range(n_groups):
        texts = near_copies(rng, 300, copies, 2)
        (pos if labels[g] else neg).extend(texts)
        (pos_group if labels[g] else neg_group).extend([g] * copies)
    return pos, neg, pos_group + neg_group


@pytest.fixture(scope="module")
def grouped() -> tuple[list[str], list[str], list[int], QualityModel]:
    pos, neg, group = grouped_corpus(0)
    return pos, neg, group, train_quality_classifier(pos, neg, seed=0, settings=SMALL)


def test_near_copies_never_straddle_the_held_out_split_or_two_folds(grouped):
    pos, neg, group, model = grouped
    texts = pos + neg
    fold_of = dict(zip(model.trained_fingerprint.tolist(), model.trained_fold.tolist()))
    side = [fold_of.get(fingerprint(t, SMALL.max_chars), -1) for t in texts]  # -1: held out
    by_group: dict[int, set[int]] = {}
    for g, s in zip(group, side):
        by_group.setdefault(g, set()).add(s)
    assert all(len(s) == 1 for s in by_group.values())  # held out together, or trained in one fold together
    held = [g for g, s in by_group.items() if s == {-1}]
    assert model.counts["heldout_positive"] + model.counts["heldout_negative"] == 5 * len(held) == side.count(-1)
    assert 30 <= len(held) <= 50 and len(model.folds) == 5  # about a fifth of the 200 groups held out
    assert model.near_duplicates == {"documents": 1000, "groups": 200, "grouped_documents": 1000}


def test_held_out_auc_is_not_inflated_by_memorised_near_copies(grouped):
    """Labels are random per group: the only way to score a held-out text right is to have trained on its
    near-copies. Split by group, the held-out AUC is chance; split document by document it was ~1."""
    *_, model = grouped
    assert abs(model.heldout_auc - 0.5) < 0.2


def test_near_duplicate_groups_are_the_components_of_all_pairs_at_the_threshold():
    """Against brute force: every pair's exact Jaccard (texts with words), or the same normalised text, as
    edges; its connected components. Wide LSH bands (64 x 2) make every pair above Jaccard ~0.3 a candidate,
    so the threshold itself decides pairs at 0.73 (joined) and 0.66 (not)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    rng = np.random.default_rng(3)

    def edit(words: list[str], positions: list[int]) -> list[str]:
        out = list(words)
        for p in positions:
            out[p] = str(rng.choice(VOCABULARY))
        return out

    texts = []
    for _ in range(4):  # 100-word texts; substitutions 10 words apart each drop 5 of the 96 shingles
        base = list(rng.choice(VOCABULARY, size=100))
        one = edit(base, [5, 25, 45])                     # Jaccard with base 81/111 = 0.73: joined
        texts += [" ".join(base), " ".join(one), " ".join(edit(base, [10, 30, 50, 70])),  # 76/116 = 0.66: not
                  " ".join(edit(one, [60, 80, 94])),      # 0.73 with `one` but ~0.5 with base: joined via `one`
                  " ".join(base).upper() + "  "]          # the same normalised text
    texts += ["", "  ", "!!", "!!", "?", "a b c", "A  B c", "a b d"]  # no words; fewer than five words
    order = rng.permutation(len(texts))
    texts = [texts[i] for i in order]
    params = LSHParams(bands=64, rows=2)
    flat, offsets = shingle_sets(texts)
    sets = [flat[offsets[i]:offsets[i + 1]] for i in range(len(texts))]
    edges = [(i, j) for i in range(len(texts)) for j in range(i + 1, len(texts))
             if normalise(texts[i]) == normalise(texts[j])
             or (len(sets[i]) and len(sets[j]) and jaccard(sets[i], sets[j]) >= params.threshold)]
    sims = [jaccard(sets[i], sets[j]) for i in range(len(texts)) for j in range(i) if len(sets[i]) and len(sets[j])]
    assert any(0.7 <= s < 0.75 for s in sims) and any(0.6 < s < 0.7 for s in sims)  # pairs either side of it
    i, j = np.array(edges).T
    _, ref = connected_components(coo_matrix((np.ones(len(i)), (i, j)), shape=(len(texts),) * 2), directed=False)
    _, first = np.unique(ref, return_index=True)
    expected = np.argsort(np.argsort(first))[ref]  # numbered in order of each group's first text
    got = near_duplicate_groups(texts, params)
    np.testing.assert_array_equal(got, expected)
    # per family: {base, one, chain, upper} and the 0.66 copy; then {"", "  "}, {"!!", "!!"}, {"?"},
    # {"a b c", "A  B c"}, {"a b d"}
    assert got.max() + 1 == 4 * 2 + 5
    # the default 14 x 8 bands may miss a pair at 0.73 (caught with probability 0.6), never join one below it
    default = near_duplicate_groups(texts)
    assert all(got[default == g].min() == got[default == g].max() for g in range(default.max() + 1))


def test_too_few_distinct_documents_are_refused_with_a_clear_message():
    rng = np.random.default_rng(1)
    neg = [" ".join(rng.choice(VOCABULARY, size=50)) for _ in range(10)]
    copies = near_copies(rng, 300, 10, 2)  # ten documents, one group of near-copies
    with pytest.raises(DataInputError, match="near-duplicates leave too few distinct documents.*positive_texts 10 "
                                             "documents in 1 groups"):
        train_quality_classifier(copies, neg, seed=0, settings=SMALL)
    same = ["The same text."] * 4 + ["the  SAME text."] * 4  # exact duplicates after normalising
    with pytest.raises(DataInputError, match="negative_texts 8 documents in 1 groups"):
        train_quality_classifier(neg, same, seed=0, settings=SMALL)


def test_a_model_saved_before_near_duplicate_groups_were_recorded_still_loads(grouped, tmp_path):
    *_, model = grouped
    path = model.save(tmp_path / "model")
    assert QualityModel.load(path).near_duplicates == model.near_duplicates
    meta = json.loads((path / "model.json").read_text())
    del meta["near_duplicates"]  # model.json as saved before
    (path / "model.json").write_text(json.dumps(meta))
    old = QualityModel.load(path)
    assert old.near_duplicates == {} and old.counts == model.counts
    texts = grouped[0][:3] + grouped[1][:3]
    np.testing.assert_array_equal(old.score(texts), model.score(texts))


def _edited(text: str, rng: np.random.Generator, changed: int) -> str:
    words = text.split()
    for p in rng.choice(len(words), size=changed, replace=False):
        words[p] = str(rng.choice(VOCABULARY))
    return " ".join(words)


def test_a_near_copy_of_a_training_text_is_scored_by_the_fold_model_that_did_not_see_it(grouped):
    """Labels are random per group, so only memory scores a text right. A fresh near-copy of a training text
    (two more words changed: Jaccard ~0.9 with it) went to the main model, which trained on its group, and was
    scored by memory (AUC ~1); routed to its group's fold model it is scored at chance, as its twins are."""
    pos, neg, group, model = grouped
    rng = np.random.default_rng(11)
    fold_of = dict(zip(model.trained_fingerprint.tolist(), model.trained_fold.tolist()))
    trained = [(t, int(i < len(pos)), fold_of[fingerprint(t, SMALL.max_chars)])
               for i, t in enumerate(pos + neg) if fingerprint(t, SMALL.max_chars) in fold_of]
    copies = [_edited(t, rng, 2) for t, _, _ in trained]
    labels = np.array([y for _, y, _ in trained])
    assert not any(fingerprint(c, SMALL.max_chars) in fold_of for c in copies)  # not the training texts themselves
    np.testing.assert_array_equal(model.routed_folds(copies), [k for *_, k in trained])
    main = roc_auc_score(labels, model.logits(copies))
    routed = roc_auc_score(labels, model.score(copies))
    assert main > 0.95 and abs(routed - 0.5) < 0.15, (main, routed)
    by_fold = np.array([model.folds[k].logits([c])[0] for c, (*_, k) in zip(copies, trained)])
    np.testing.assert_allclose(model.score(copies), 1 / (1 + np.exp(-by_fold)), rtol=1e-12)


def test_near_copy_routing_matches_exact_jaccard_away_from_the_threshold():
    """Against brute force: a query goes to a reference row when its exact Jaccard with it is clearly above the
    threshold (>= 0.8) and to none when every exact Jaccard is clearly below (<= 0.6); the estimate decides
    only the band between. Texts without words are never routed."""
    from curation.quality_groups import minhash_rows, nearest_near_copy

    rng = np.random.default_rng(5)
    params = LSHParams()
    reference = [" ".join(rng.choice(VOCABULARY, size=200)) for _ in range(60)]
    queries = [_edited(reference[i], rng, k) for i in range(60) for k in (0, 2, 6, 14)] + ["", "!!"]
    query_sigs, query_signed = minhash_rows(queries, params)
    ref_sigs, ref_signed = minhash_rows(reference, params)
    got = nearest_near_copy(query_sigs, query_signed, ref_sigs, ref_signed, params)
    flat_q, off_q = shingle_sets(queries)
    flat_r, off_r = shingle_sets(reference)
    checked = 0
    for q in range(len(queries)):
        exact = [jaccard(flat_q[off_q[q]:off_q[q + 1]], flat_r[off_r[r]:off_r[r + 1]]) if off_q[q + 1] > off_q[q]
                 else 0.0 for r in range(len(reference))]
        best = int(np.argmax(exact))
        if exact[best] >= 0.8:
            assert got[q] == best
            checked += 1
        elif exact[best] <= 0.6:
            assert got[q] == -1
            checked += 1
    assert checked >= 170 and got[-2:].tolist() == [-1, -1] and not query_signed[-2:].any()


def test_a_model_saved_before_signatures_were_kept_routes_exact_copies_only(grouped, tmp_path):
    pos, neg, _, model = grouped
    path = model.save(tmp_path / "model")
    loaded = QualityModel.load(path)
    np.testing.assert_array_equal(loaded.trained_signature, model.trained_signature)
    assert loaded.lsh == model.lsh == {"bands": 14, "rows": 8, "threshold": 0.7, "seed": 42}
    with np.load(path / "trained.npz") as t:
        kept = {"fingerprint": t["fingerprint"], "fold": t["fold"]}
    np.savez(path / "trained.npz", **kept)  # trained.npz as saved before
    old = QualityModel.load(path)
    assert old.trained_signature.size == 0
    texts = pos[:20] + neg[:20]
    copies = [_edited(t, np.random.default_rng(1), 2) for t in texts]
    np.testing.assert_array_equal(old.score(texts), model.score(texts))  # exact copies: routed as before
    np.testing.assert_array_equal(old.score(copies), 1 / (1 + np.exp(-model.logits(copies))))  # near: main model
    model.save(path)
    meta = json.loads((path / "model.json").read_text())
    for lsh in ({**meta["lsh"], "rows": 4}, {**meta["lsh"], "colour": 1}, {}):  # not the signatures' settings
        (path / "model.json").write_text(json.dumps({**meta, "lsh": lsh}))
        with pytest.raises(DataInputError, match="damaged quality model"):
            QualityModel.load(path)
