"""A recipe's `data:`: the corpus its mixture is learned from, or checked against.

`data:` names a corpus manifest (YAML, `rungs.data.manifest`) or a prepared directory (the output of
`ladder data prepare`, whose `meta.json` records the manifest it came from and, per training source,
its tokens after decontamination, each document with its EOS). From it a recipe takes each source's
name, domain and share and, from a prepared directory only, its unique tokens: a bare manifest has no
token counts (tokens depend on the tokenizer and on what decontamination removes), so a recipe that
needs them must name the prepared directory. The training job itself always prepares from the
manifest, in its own cache (`rungs.data.prepare.ensure_prepared`, a BPE of the recipe's vocabulary):
the same inputs give the same tokens, which is why a prepared directory made with another tokenizer or
vocabulary, or from a manifest (or file) changed since, is refused here.

Checks, the same wherever a recipe is loaded (`ladder plan`, `ladder train`, `ladder sweep plan|run`):
errors (exit 2) for what would make a run wrong, warnings (logged) for a choice worth seeing:

- a mixture source the corpus does not have: error;
- a mixture `unique_tokens` above what the prepared corpus holds (beyond `UNIQUE_TOLERANCE`): error;
- a mixture share other than the manifest's: warning naming both (the recipe's share is what trains);
- a source whose domain has no held-out set: warning (that domain gets no BPB);
- a corpus source the mixture leaves out: warning (it is not trained on).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ladder.errors import LadderInputError
from rungs.data.out_dir import read_state
from rungs.data.relocation import MANIFEST_RELATIVE, located

log = logging.getLogger(__name__)

# A hand-written unique_tokens may exceed the prepared count by this fraction (a count rounded up, a
# recipe written before a re-prepare) before it is an error: a cap the corpus cannot fill is not a plan.
UNIQUE_TOLERANCE = 0.05
SHARE_WARN_TOLERANCE = 1e-6
# The tokenizer the training job prepares with (rungs.data.prepare.ensure_prepared's default).
JOB_TOKENIZER = "bpe"


@dataclass(frozen=True)
class CorpusSource:
    name: str
    domain: str
    share: float
    unique_tokens: int | None  # training tokens after decontamination; None for a bare manifest


@dataclass(frozen=True)
class CorpusData:
    path: Path  # what `data:` named, absolute
    manifest: Path  # the manifest the training job prepares from
    prepared: bool
    sources: tuple[CorpusSource, ...]
    eval_domains: tuple[str, ...]
    tokenizer: dict | None  # {kind, vocab_size, eos_id} of a prepared directory
    key: str | None  # a prepared directory's input key (rungs.data.prepare.input_key)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    def source(self, name: str) -> CorpusSource | None:
        return next((s for s in self.sources if s.name == name), None)


_CACHE: dict[tuple[str, int], CorpusData] = {}


def resolve_data_path(value: str | Path, folder: Path | None) -> Path:
    """A relative `data:` is relative to the folder of the file that names it (as manifest paths are)."""
    path = Path(value).expanduser()
    if not path.is_absolute() and folder is not None:
        path = folder / path
    return path.resolve()


def read_corpus(path: str | Path, *, where: str | None = None, field: str = "data") -> CorpusData:
    """The corpus at `path` (a manifest file or a prepared directory); LadderInputError naming `where`
    and `field` when it is missing or unreadable. Cached per path and modification time."""
    path = Path(path).resolve()
    marker = path / "meta.json" if path.is_dir() else path
    try:
        stamp = marker.stat().st_mtime_ns
    except OSError:
        stamp = -1
    cached = _CACHE.get((str(path), stamp))
    if cached is not None:
        return cached
    if path.is_dir():
        corpus = _read_prepared(path, where, field)
    elif path.is_file():
        corpus = CorpusData(path=path, **_read_manifest(path, where, field), prepared=False, tokenizer=None, key=None)
    else:
        raise LadderInputError(f"{path} not found; give a corpus manifest (YAML) or a directory written by "
                               "`ladder data prepare`", where=where, field=field)
    _CACHE[(str(path), stamp)] = corpus
    return corpus


def _read_manifest(path: Path, where: str | None, field: str) -> dict:
    from rungs.data.errors import DataInputError
    from rungs.data.manifest import load_manifest

    try:
        manifest = load_manifest(path)
    except DataInputError as err:
        raise LadderInputError(f"corpus manifest {err}", where=where, field=field) from None
    return {"manifest": manifest.path,
            "sources": tuple(CorpusSource(s.name, s.domain, float(s.share or 0.0), None) for s in manifest.sources),
            "eval_domains": tuple(dict.fromkeys(e.domain for e in manifest.eval_sets))}


def _read_prepared(path: Path, where: str | None, field: str) -> CorpusData:
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise LadderInputError(f"{path} is a directory without meta.json: not a prepared corpus; run `ladder data "
                               "prepare MANIFEST --out DIR` and name DIR, or name the manifest", where=where, field=field)
    try:
        meta = json.loads(meta_path.read_text())
        # A weighted source's unique tokens are one weighted pass, Σ weight · tokens (rungs.data.sampler).
        sources = tuple(CorpusSource(s["name"], s["domain"], float(s["share"]),
                                     int(round(float(s.get("weighted_tokens", s["tokens"])))))
                        for s in meta["sources"])
        evals = tuple(dict.fromkeys(e["domain"] for e in meta["eval"]))
        # after the project folder moved: where the manifest lies relative to this directory (progress.json)
        manifest = located(meta["manifest"], (read_state(path / "progress.json") or {}).get(MANIFEST_RELATIVE), path)
        tokenizer = dict(meta["tokenizer"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LadderInputError(f"{meta_path} is not a prepared corpus's record ({type(err).__name__}: {err}); "
                               "prepare it again", where=where, field=field) from None
    if not manifest.is_file():
        raise LadderInputError(f"{path} was prepared from {manifest}, which no longer exists; the training job "
                               "prepares from the manifest: restore it, or prepare again from where it is now",
                               where=where, field=field)
    return CorpusData(path=path, manifest=manifest, prepared=True, sources=sources, eval_domains=evals,
                      tokenizer=tokenizer, key=meta.get("key"))


def check_tokenizer(corpus: CorpusData, vocab_size: int, *, where: str | None, field: str = "data") -> list[str]:
    """A prepared directory's counts are the job's only when it holds exactly what the job will prepare:
    the same input key (`rungs.data.prepare.input_key`: the manifest's text and its files' fingerprints,
    a BPE, the recipe's vocab_size). An error otherwise: another tokenizer or vocabulary counts other
    tokens, and a manifest or file changed since may hold other documents."""
    if not corpus.prepared or corpus.tokenizer is None:
        return []
    kind = corpus.tokenizer.get("kind")
    if kind != JOB_TOKENIZER:
        raise LadderInputError(
            f"{corpus.path} was prepared with the {kind!r} tokenizer, but the training job prepares with a trained "
            f"{JOB_TOKENIZER!r} of the recipe's vocab_size={vocab_size}, whose token counts differ; run `ladder data "
            f"prepare {corpus.manifest} --out DIR --vocab-size {vocab_size}` and name DIR", where=where, field=field)
    from rungs.data.errors import DataInputError
    from rungs.data.manifest import load_manifest

    from rungs.data.out_dir import same_corpus

    try:
        manifest = load_manifest(corpus.manifest)
        current = job_input_key(manifest, vocab_size)
    except DataInputError as err:
        raise LadderInputError(f"the manifest {corpus.path} was prepared from: {err}", where=where,
                               field=field) from None
    if current != corpus.key:
        # What `prepare` checks before it writes into a prepared directory (rungs.data.out_dir): the same
        # manifest, tokenizer and vocabulary is brought up to date as it is; another one needs --overwrite.
        identity = {"manifest": str(manifest.path.resolve()), "tokenizer": JOB_TOKENIZER, "vocab_size": vocab_size}
        if same_corpus(corpus.path, identity):
            why, fix = f"{corpus.manifest} or one of its files changed since", ""
        else:
            why = f"it was prepared with another --vocab-size or tokenizer than the recipe's vocab_size={vocab_size}"
            fix = (" --overwrite` (it replaces the corpus prepared there; or prepare into a new `--out DIR` and "
                   "name DIR)")
        raise LadderInputError(
            f"{corpus.path} is not what the training job will prepare: {why}, so its token counts may not be the "
            f"job's; run `ladder data prepare {corpus.manifest} --out {corpus.path} --vocab-size {vocab_size}"
            f"{fix or '` again'}", where=where, field=field)
    return []


def job_input_key(manifest, vocab_size: int) -> str:
    """`rungs.data.prepare.input_key(manifest, "bpe", vocab_size)`, the key the training job prepares
    under, computed here because that module reaches Ray (its workers), which planning must not import;
    tests/ladder/test_recipe_data.py holds the two equal."""
    import hashlib

    from rungs.data.corpus import FORMAT_VERSION
    from rungs.data.tokenizer import UINT16_VOCAB

    wide = "|uint32" if vocab_size > UINT16_VOCAB else ""
    h = hashlib.sha256(f"v{FORMAT_VERSION}|{JOB_TOKENIZER}|{vocab_size}{wide}|".encode())
    h.update(manifest.content_hash().encode())
    return h.hexdigest()


def check_mixture(mixture: list, corpus: CorpusData, *, where: str | None, field: str = "mixture") -> list[str]:
    """Errors for a mixture the corpus cannot serve; the warnings (strings) for what deserves a look."""
    warnings: list[str] = []
    names = corpus.names
    for i, s in enumerate(mixture):
        found = corpus.source(s.name)
        if found is None:
            raise LadderInputError(f"source {s.name!r} is not in the corpus {corpus.path} (its sources: "
                                   f"{', '.join(names)}); a written mixture is checked against the corpus: to take "
                                   f"the mixture from it, use a copy of the recipe without `mixture:`",
                                   where=where, field=f"{field}[{i}].name")
        if abs(s.share - found.share) > SHARE_WARN_TOLERANCE:
            warnings.append(f"{field}[{i}] {s.name}: the recipe's share {s.share:g} differs from the manifest's "
                            f"{found.share:g} (the recipe's trains)")
        if s.unique_tokens is not None and found.unique_tokens is not None and \
                s.unique_tokens > found.unique_tokens * (1 + UNIQUE_TOLERANCE):
            raise LadderInputError(
                f"{s.name}: unique_tokens {s.unique_tokens:.4g} is {s.unique_tokens / found.unique_tokens:.3g}x what "
                f"the prepared corpus holds ({found.unique_tokens:,} tokens after decontamination); leave "
                f"unique_tokens out to take the corpus's count", where=where, field=f"{field}[{i}].unique_tokens")
        domain = s.domain or found.domain
        if domain not in corpus.eval_domains:
            warnings.append(f"{field}[{i}] {s.name}: the corpus has no held-out set for domain {domain!r}, so that "
                            f"domain will have no BPB (held-out domains: {', '.join(corpus.eval_domains) or 'none'})")
    used = {s.name for s in mixture}
    left = [n for n in names if n not in used]
    if left:
        warnings.append(f"corpus sources not in the mixture (not trained on): {', '.join(left)}")
    return warnings


_WARNED: set[str] = set()


def log_warnings(warnings: list[str], where: str | None) -> None:
    """Each warning once per process (a sweep loads its recipe once per distinct rung)."""
    for text in warnings:
        line = f"{where}: {text}" if where else text
        if line not in _WARNED:
            _WARNED.add(line)
            log.warning("%s", line)
