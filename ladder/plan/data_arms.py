"""A sweep's data arm: the recipe re-planned on the arm's own corpus, its identity, its held-out sets.

A data arm (`arms: {dedup: {data: ../arms/dedup/prepared}}` in a sweep block) trains the same recipe
on another corpus, usually a curated one (`ladder data mix`, then `ladder data prepare`). Its mixture
keeps the recipe's sources and shares, but every source's unique tokens come from the arm's prepared
corpus, never from the recipe's written `unique_tokens`: after curation a source holds fewer tokens,
so at every rung it is repeated as often as the arm's own full-scale run would repeat it
(`ladder.plan.sources`). A bare manifest has no token counts, so an arm names a prepared directory.

The arm's identity in a trial key is a content hash: SHA-256 over the arm's manifest text and, per
training and held-out file, its name in the manifest and the SHA-256 of all its bytes (`ladder data mix`
writes the same bytes for the same kept documents). A rule that changes the kept documents (or their
weights) changes it; rebuilding an arm that keeps the same documents does not, whatever the files'
modification times. The trial key then leaves out where the arm's manifest lies (`rungs.identity.config_key`):
a project folder moved as a whole keeps its arms' keys. Hashing reads every byte once per process (about a
second per GB).

Arms are compared on the same held-out sets: `eval_identity` is what every arm of a block must share.
"""

from __future__ import annotations

from pathlib import Path

from ladder.errors import LadderInputError
from ladder.plan.corpus_data import read_corpus
from ladder.plan.recipe import Recipe, load_recipe, with_data


def load_arm_recipe(recipe: str | Path, data: str | Path, *, where: str | None = None,
                    field: str = "data") -> Recipe:
    """The recipe with its mixture's unique tokens (and, with no mixture, its sources) from `data`."""
    base = load_recipe(recipe)
    if base.mixture is not None:
        base = base.model_copy(update={"mixture": [s.model_copy(update={"unique_tokens": None})
                                                   for s in base.mixture]})
    return with_data(base, Path(data).resolve(), where=where or str(recipe), field=field)


_FILE_HASHES: dict[tuple[str, str], bytes] = {}


def _file_sha256(file) -> bytes:
    """SHA-256 of all of a file's bytes, cached per file and fingerprint (size, mtime, ends)."""
    import hashlib

    from rungs.data.storage import fingerprints, open_binary

    stamp = (str(file), fingerprints([file])[0])
    if stamp not in _FILE_HASHES:
        digest = hashlib.sha256()
        with open_binary(file) as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        _FILE_HASHES[stamp] = digest.digest()
    return _FILE_HASHES[stamp]


def _manifest(path: Path, where: str | None, field: str):
    from rungs.data.errors import DataInputError
    from rungs.data.manifest import load_manifest

    try:
        return load_manifest(path)
    except DataInputError as err:
        raise LadderInputError(f"corpus manifest {err}", where=where, field=field) from None


def data_identity(data: str | Path, *, where: str | None = None, field: str = "data") -> str:
    """The content hash of the arm's manifest and files (module docstring): what a trial key carries."""
    import hashlib

    corpus = read_corpus(data, where=where, field=field)
    if not corpus.prepared:
        raise LadderInputError(f"{corpus.path} is a bare manifest: a data arm takes each source's unique tokens "
                               f"from a prepared corpus; run `ladder data prepare {corpus.path} --out DIR "
                               "--vocab-size V` (V: the recipe's vocab_size) and name DIR", where=where, field=field)
    manifest = _manifest(corpus.manifest, where, field)
    h = hashlib.sha256(manifest.path.read_bytes())
    for ds in manifest.sources + manifest.eval_sets:
        for f in ds.files:
            h.update(ds.rel(f).encode())
            h.update(_file_sha256(f))
    return h.hexdigest()


def eval_identity(data: str | Path | None, *, where: str | None = None, field: str = "data") -> tuple:
    """The held-out sets of a corpus (None: the demo corpus) as (name, domain, its files' content hashes)
    per set: two arms score on the same text exactly when these are equal."""
    from rungs.data.manifest import DEMO_MANIFEST

    manifest_path = DEMO_MANIFEST if data is None else read_corpus(data, where=where, field=field).manifest
    manifest = _manifest(Path(manifest_path), where, field)
    return tuple((e.name, e.domain, tuple(sorted(_file_sha256(f) for f in e.files))) for e in manifest.eval_sets)
