"""A document-quality classifier in DCLM's shape (Li et al. 2024, arXiv 2406.11794 §4.4): a linear model over
word unigrams and bigrams, trained on named positive sources against named negative ones; its score is the
probability that a document looks like the positives, and a mix keeps the top fraction.

DCLM used fastText. Here it is scikit-learn: a `HashingVectorizer` (word 1-2-grams hashed into 2^20
features, lower-cased, rows L2-normalised; stateless, so nothing but its settings needs saving) and a
`LogisticRegression` (L2, lbfgs, deterministic). Why not fastText: it is not a dependency, its last wheel
(`fasttext-wheel` 0.9.2) breaks on NumPy 2 (`predict` raises "Unable to avoid copy"), its multi-threaded
SGD gives different models run to run unless trained on one thread, and its `.bin` format is its own.
scikit-learn is installed already and gives the same model from the same inputs.

`heldout_auc` is measured on a stratified held-out split (`heldout_fraction`, seeded), and the model returned
is the one fitted on the rest, so the AUC describes exactly the model that scores. Its own training documents it
does not score in-sample: a model scores what it was fitted on higher (positives) or lower (negatives) than
their unseen siblings, so a `keep_top` over a source it trained on would rank partly by training membership
(DCLM's own setup: web as the negatives, then the web filtered). Each training document is scored instead by
one of `OUT_OF_FOLD` models fitted on the training split less its stratified fold (cross-fitting): the model
keeps each training text's fingerprint (`fingerprint`: BLAKE2b of the text it scores), its MinHash signature and
its fold, and `score` routes a text it trained on, or a near-copy of one (a later document of a source past the
documents trained on, a copy in another source), to the fold model that did not see it or its group: scored by
the main model, a near-copy is scored by memory of its twin. Both splits are by near-duplicate
group (`curation.quality_groups`: copies and texts at Jaccard >= 0.7, as the pipeline's `near` tagger finds
them, in one group; scikit-learn's `StratifiedGroupKFold`): split text by text, a held-out text or a fold's
own text would have a near-copy among the texts its model trained on, and the AUC or the out-of-fold score
would reward memory. `near_duplicates` records how many documents and groups there were. `save` writes a
directory holding `weights.npz` (the non-zero coefficients and their feature indices, the intercept) and
`model.json` (the vectorizer's settings, the AUC, the counts, the near-duplicate groups): no pickle, loadable with `allow_pickle=False`.
Documents are scored on their first `max_chars` characters (default 20,000). A path that holds no saved model
(or a damaged one) and a class too small to split are the caller's input: `rungs.data.errors.DataInputError`
(a ValueError), which the CLI reports as one line.
"""

from __future__ import annotations

import json
import logging
import math
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from curation.store import write_npz
from rungs.data.atomic import atomic_write_bytes
from rungs.data.errors import DataInputError

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
WEIGHTS_FILE = "weights.npz"
META_FILE = "model.json"
TRAINED_FILE = "trained.npz"  # the training texts' fingerprints and folds (empty or absent: no out-of-fold models)
FOLDS_DIR = "folds"
HELDOUT_FRACTION = 0.2
OUT_OF_FOLD = 5  # folds of the training split that score its own documents (fewer where a class is smaller)


def fingerprint(text: str, max_chars: int) -> int:
    """A text's identity as a model scores it (its first `max_chars` characters): 64 bits of BLAKE2b."""
    import hashlib

    digest = hashlib.blake2b(text[:max_chars].encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def split_sizes(n_documents: int, heldout_fraction: float) -> tuple[int, int]:
    """(train, held-out) sizes of scikit-learn's `train_test_split` of `n_documents`: ceil(fraction·n) held out."""
    held = math.ceil(heldout_fraction * n_documents)
    return n_documents - held, held


def min_documents(heldout_fraction: float = HELDOUT_FRACTION) -> int:
    """The fewest documents of one class that `train_quality_classifier` can split with as many of the other
    class: the stratified split then trains on at least one of each class and holds out at least one of each
    (3 at the default fifth; 10 at 0.9, where the held-out share is rounded up over both classes). Distinct
    documents: near-duplicates are split as one (`curation.quality_groups`), and too few groups are refused."""
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    n = 1
    while min(split_sizes(2 * n, heldout_fraction)) < 2:
        n += 1
    return n


@dataclass(frozen=True)
class HashingSettings:
    """Everything needed to rebuild the (stateless) vectorizer."""

    n_features: int = 2**20
    ngram_max: int = 2
    lowercase: bool = True
    max_chars: int = 20_000

    def vectorizer(self):
        from sklearn.feature_extraction.text import HashingVectorizer

        return HashingVectorizer(n_features=self.n_features, ngram_range=(1, self.ngram_max), lowercase=self.lowercase,
                                 alternate_sign=False, norm="l2", dtype=np.float64)


def _check_texts(texts: Sequence[str], name: str) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise ValueError(f"{name} must be a sequence of str, got {type(texts).__name__}")
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise ValueError(f"{name}[{bad}] is {type(texts[bad]).__name__}, not str")
    return list(texts)


@dataclass
class QualityModel:
    """A fitted classifier: P(positive | text) = sigmoid(hashed n-gram features . coef + intercept)."""

    settings: HashingSettings
    coef_index: np.ndarray  # int64 feature indices with a non-zero coefficient
    coef_value: np.ndarray  # float64, the coefficients there
    intercept: float
    heldout_auc: float
    counts: dict[str, int] = field(default_factory=dict)  # documents: train/held-out x positive/negative
    # Out-of-fold scoring of the training texts (module docstring): fold k's model, and each training text's
    # fingerprint with its fold. Empty: every text is scored by this model (a model saved before they existed).
    folds: list[QualityModel] = field(default_factory=list)
    trained_fingerprint: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    trained_fold: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # The training texts' near-duplicate groups (`curation.quality_groups`): documents, groups, documents in a
    # group of more than one. Empty: not recorded (a fold model, or a model saved before they were).
    near_duplicates: dict[str, int] = field(default_factory=dict)
    # The training texts' MinHash signatures (rows as trained_fingerprint's; a text without a word unsigned) and
    # the LSH settings that made them: a scored text that is a near-copy of a training text, not the same text,
    # goes to that text's fold model too. Empty: near-copies are not routed (a model saved before they were).
    trained_signature: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.uint32))
    trained_signed: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    lsh: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.coef_index = np.asarray(self.coef_index, dtype=np.int64)
        self.coef_value = np.asarray(self.coef_value, dtype=np.float64)
        if self.coef_index.shape != self.coef_value.shape or self.coef_index.ndim != 1:
            raise ValueError("coef_index and coef_value must be 1-D arrays of the same length")
        if self.coef_index.size and (self.coef_index.min() < 0 or self.coef_index.max() >= self.settings.n_features):
            raise ValueError(f"coefficient indices must lie in [0, {self.settings.n_features})")
        self._coef = np.zeros(self.settings.n_features)
        self._coef[self.coef_index] = self.coef_value
        self._vectorizer = self.settings.vectorizer()
        self.trained_fingerprint = np.asarray(self.trained_fingerprint, dtype=np.int64)
        self.trained_fold = np.asarray(self.trained_fold, dtype=np.int64)
        if self.trained_fingerprint.shape != self.trained_fold.shape or (
                self.trained_fold.size and not (0 <= self.trained_fold.min() and self.trained_fold.max() < len(self.folds))):
            raise ValueError("trained_fingerprint and trained_fold must be 1-D arrays of one length, folds in range")
        self._fold_of = dict(zip(self.trained_fingerprint.tolist(), self.trained_fold.tolist()))
        self.trained_signature = np.asarray(self.trained_signature, dtype=np.uint32)
        self.trained_signed = np.asarray(self.trained_signed, dtype=bool)
        if self.trained_signature.size:
            from curation.minhash import LSHParams

            width = LSHParams(**self.lsh).num_perm if self.lsh else -1  # a wrong setting raises here, not at score
            if self.trained_signature.shape != (self.trained_fold.size, width) \
                    or self.trained_signed.shape != self.trained_fold.shape:
                raise ValueError("trained_signature must hold one row of lsh's num_perm per trained text, with "
                                 "trained_signed")

    def logits(self, texts: Sequence[str]) -> np.ndarray:
        texts = _check_texts(texts, "texts")
        if not texts:
            return np.empty(0)
        cap = self.settings.max_chars
        features = self._vectorizer.transform([t[:cap] for t in texts])
        return np.asarray(features @ self._coef, dtype=np.float64) + self.intercept

    def score(self, texts: Sequence[str]) -> np.ndarray:
        """Probability (float64, in [0, 1]) that each text is like the positives: by this model, or, for a text
        it was trained on or a near-copy of one, by the fold model that did not see it (module docstring)."""
        from scipy.special import expit

        texts = _check_texts(texts, "texts")
        logits = self.logits(texts)
        if self._fold_of:
            fold = self.routed_folds(texts)
            for k in np.unique(fold[fold >= 0]).tolist():
                rows = np.flatnonzero(fold == k)
                logits[rows] = self.folds[k].logits([texts[i] for i in rows])
        return expit(logits)

    def routed_folds(self, texts: Sequence[str]) -> np.ndarray:
        """The fold model that scores each text (int64; -1: this model): a training text's own fold, found by
        its fingerprint; else, where signatures are kept, the fold of the training text it is a near-copy of
        (`curation.quality_groups.nearest_near_copy`: an LSH candidate whose MinHash estimate of Jaccard reaches
        the grouping's threshold)."""
        from curation.minhash import LSHParams
        from curation.quality_groups import minhash_rows, nearest_near_copy

        cap = self.settings.max_chars
        fold = np.array([self._fold_of.get(fingerprint(t, cap), -1) for t in texts], dtype=np.int64)
        rest = np.flatnonzero(fold < 0)
        if self.trained_signature.size and rest.size:
            params = LSHParams(**self.lsh)
            sigs, signed = minhash_rows([texts[i][:cap] for i in rest], params)
            near = nearest_near_copy(sigs, signed, self.trained_signature, self.trained_signed, params)
            fold[rest[near >= 0]] = self.trained_fold[near[near >= 0]]
        return fold

    def save(self, path: str | Path) -> Path:
        """Write `path/weights.npz` and `path/model.json` (the directory is created); returns `path`.

        Each file is written to a temporary and renamed (`rungs.data.atomic`), model.json last and any old one
        removed first: a save killed (or out of disk) at any point leaves a whole model or none (`load` then
        refuses the directory, and `curate` trains again), never a half-written file or one model's settings
        with another's weights."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / META_FILE).unlink(missing_ok=True)
        write_npz(out / WEIGHTS_FILE, coef_index=self.coef_index, coef_value=self.coef_value,
                  intercept=np.array([self.intercept]))
        for k, fold in enumerate(self.folds):
            fold.save(out / FOLDS_DIR / str(k))
        # always written (empty without folds), so a save over another model's directory leaves no stale one
        write_npz(out / TRAINED_FILE, fingerprint=self.trained_fingerprint, fold=self.trained_fold,
                  signature=self.trained_signature, signed=self.trained_signed)
        meta = {"format": "curation.quality", "version": FORMAT_VERSION, "settings": asdict(self.settings),
                "heldout_auc": self.heldout_auc, "counts": self.counts, "near_duplicates": self.near_duplicates,
                "lsh": self.lsh}
        atomic_write_bytes(out / META_FILE, (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
        return out

    @classmethod
    def load(cls, path: str | Path) -> QualityModel:
        """The model `save` wrote in `path`; a DataInputError (a ValueError) naming the file if `path` is not
        one, or holds a damaged one."""
        src = Path(path)
        meta_path, weights_path = src / META_FILE, src / WEIGHTS_FILE
        if not meta_path.is_file() or not weights_path.is_file():
            missing = "does not exist" if not src.exists() else f"has no {META_FILE} and {WEIGHTS_FILE}"
            raise DataInputError(f"{missing}: not a saved quality model (a directory `QualityModel.save` wrote)",
                                 where=str(src))
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DataInputError(f"not valid JSON ({err}): not a saved quality model", where=str(meta_path)) from None
        if not isinstance(meta, dict) or meta.get("format") != "curation.quality" \
                or meta.get("version") != FORMAT_VERSION:
            found = (meta.get("format"), meta.get("version")) if isinstance(meta, dict) else (None, None)
            raise DataInputError(f"format {found[0]!r} version {found[1]!r}, expected 'curation.quality' version "
                                 f"{FORMAT_VERSION}: not a saved quality model", where=str(meta_path))
        try:
            folds, trained = [], {"fingerprint": np.zeros(0, np.int64), "fold": np.zeros(0, np.int64),
                                  "signature": np.zeros((0, 0), np.uint32), "signed": np.zeros(0, bool)}
            if (src / TRAINED_FILE).is_file():
                with np.load(src / TRAINED_FILE, allow_pickle=False) as t:  # signatures: absent before they were kept
                    trained.update({name: t[name] for name in trained if name in t.files})
                folds = [cls.load(src / FOLDS_DIR / str(k)) for k in range(int(trained["fold"].max(initial=-1)) + 1)]
            with np.load(weights_path, allow_pickle=False) as w:
                return cls(HashingSettings(**meta["settings"]), w["coef_index"], w["coef_value"],
                           float(w["intercept"][0]), float(meta["heldout_auc"]), dict(meta.get("counts", {})),
                           folds, trained["fingerprint"], trained["fold"], dict(meta.get("near_duplicates", {})),
                           trained["signature"], trained["signed"], dict(meta.get("lsh", {})))
        except (OSError, EOFError, zipfile.BadZipFile, KeyError, IndexError, TypeError, ValueError) as err:
            raise DataInputError(f"a damaged quality model ({type(err).__name__}: {err})", where=str(src)) from None


def train_quality_classifier(positive_texts: Sequence[str], negative_texts: Sequence[str], seed: int, *,
                             heldout_fraction: float = HELDOUT_FRACTION, C: float = 10.0, max_iter: int = 1000,
                             settings: HashingSettings | None = None) -> QualityModel:
    """Fit on a stratified (1 - heldout_fraction) split of positives (label 1) and negatives (label 0) by
    near-duplicate group (`curation.quality_groups`), fixed by `seed`; measure the ROC AUC on the rest. `C`:
    inverse L2 strength (rows are unit-norm, so the default of 1 underfits)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from curation.minhash import LSHParams
    from curation.quality_groups import heldout_split, minhash_rows, near_duplicate_groups, out_of_fold

    pos, neg = _check_texts(positive_texts, "positive_texts"), _check_texts(negative_texts, "negative_texts")
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    need = min_documents(heldout_fraction)
    for name, texts in (("positive_texts", pos), ("negative_texts", neg)):
        if len(texts) < need:  # too few to split: the caller's sources are too small (input, not a bug)
            raise DataInputError(f"{name} has {len(texts)} documents: too few to hold out {heldout_fraction:.0%} "
                                 f"and train on the rest (needs at least {need}: one of each, per class)")
    if not C > 0:
        raise ValueError(f"C must be > 0, got {C}")
    settings = settings or HashingSettings()
    texts = [t[:settings.max_chars] for t in pos + neg]
    y = np.concatenate([np.ones(len(pos), dtype=np.int64), np.zeros(len(neg), dtype=np.int64)])
    groups = near_duplicate_groups(texts)
    group_sizes = np.bincount(groups)
    near_duplicates = {"documents": len(texts), "groups": int(group_sizes.size),
                       "grouped_documents": int(group_sizes[group_sizes > 1].sum())}
    train_idx, held_idx = heldout_split(y, groups, heldout_fraction, seed)
    features = settings.vectorizer().transform([texts[i] for i in train_idx])

    def fitted(rows: np.ndarray) -> QualityModel:
        clf = LogisticRegression(C=C, max_iter=max_iter, solver="lbfgs")
        clf.fit(features[rows], y[train_idx][rows])
        coef = clf.coef_[0]
        nonzero = np.flatnonzero(coef)
        return QualityModel(settings, nonzero, coef[nonzero], float(clf.intercept_[0]), float("nan"))

    model = fitted(np.arange(len(train_idx)))
    model.counts = {"train_positive": int(y[train_idx].sum()), "train_negative": int((1 - y[train_idx]).sum()),
                    "heldout_positive": int(y[held_idx].sum()), "heldout_negative": int((1 - y[held_idx]).sum())}
    model.heldout_auc = float(roc_auc_score(y[held_idx], model.score([texts[i] for i in held_idx])))
    fold = out_of_fold(y[train_idx], groups[train_idx], OUT_OF_FOLD, seed)
    if fold is not None:
        folds = [fitted(np.flatnonzero(fold != k)) for k in range(int(fold.max()) + 1)]
        prints = np.array([fingerprint(texts[i], settings.max_chars) for i in train_idx], dtype=np.int64)
        lsh = LSHParams()
        sigs, signed = minhash_rows([texts[i] for i in train_idx], lsh)
        model = QualityModel(model.settings, model.coef_index, model.coef_value, model.intercept, model.heldout_auc,
                             model.counts, folds, prints, fold, {}, sigs, signed, asdict(lsh))
    else:  # a class of one training group cannot be split: its texts keep in-sample scores
        logger.warning("quality classifier: a class has %d training group(s) of near-duplicates: its training "
                       "texts are scored in-sample", min(len(np.unique(groups[train_idx][y[train_idx] == c]))
                                                         for c in (0, 1)))
    model.near_duplicates = near_duplicates
    logger.info("quality classifier: %d documents in %d near-duplicate groups (%d documents share a group), split "
                "by group", near_duplicates["documents"], near_duplicates["groups"],
                near_duplicates["grouped_documents"])
    logger.info("quality classifier: %d features, held-out AUC %.4f on %d documents", model.coef_index.size,
                model.heldout_auc, held_idx.size)
    return model
