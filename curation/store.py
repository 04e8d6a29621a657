"""The curation directory: its layout, its metadata, and the attribute store.

    DIR/curation.json                  what was curated (manifest, its content key, units, partitions, taggers)
    DIR/units/<unit>.npz               per training file: uid, id, bytes, words of every document, in file order
                                       (and id__trailing_nuls where an id ends in NUL: `str_arrays`)
    DIR/attributes/<tagger>/<unit>.npz per tagger and file: one value per document, rows as in units/
    DIR/work/<tagger>/...              the tagger's shuffle files (partitioned keys, edges, labels)
    DIR/done/<stage>/<task>.json       completion markers: a task with a marker is never run again
    DIR/done/ids/<source>.json         the source's ids were checked unique across its files
    DIR/report.json, DIR/cluster_sizes.png

Every file is written through a temporary and a rename (`rungs.data.atomic`), and a task's marker only
after all its files, so a run killed at any point resumes where it was. A directory that is not empty
and holds no `curation.json` is refused: the curation only ever writes and removes its own files.

Input is checked as `prepare` checks it, with its messages: each file as it is read (`checked_documents`: no
empty file, no id twice in it, valid text), and each source's ids unique across its files by the uids of the
unit indexes (`check_source_ids`, run by whichever task indexes the source's last file). A curation of this
manifest that finished no tagger (it stopped on bad input, say) starts over once the manifest or its files
are edited; one that finished a tagger is refused then, as is a curation of another manifest.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rungs.data.atomic import atomic_write_bytes, atomic_write_json, remove_stale_temporaries
from rungs.data.errors import DataInputError
from rungs.data.manifest import DocumentSet, Manifest, checked_documents, duplicate_id, load_manifest
from rungs.data.readers import Document, FileSpec
from rungs.data.relocation import MANIFEST_RELATIVE, located, relative_to_dir, same_file
from rungs.data.storage import DataFile

log = logging.getLogger("curation")
FORMAT_VERSION = 1
META = "curation.json"
IDS_CHECKED = "ids"  # done/ids/<source>.json: the source's ids are unique across its files
OWN_FOLDERS = ("units", "attributes", "work", "done")  # what a curation that starts over removes (its own)
# Where a curation writes files (each via a temporary and a rename): a killed one's temporaries are removed there.
WRITTEN_FOLDERS = (".", "units", "attributes/*", "work/**", "done/*")
TRAILING_NULS = "__trailing_nuls"  # beside a str array: the NULs NumPy drops from each value's end (`str_arrays`)


@dataclass(frozen=True)
class Unit:
    """One training file: the unit of work of every per-file stage (small: it travels with each task)."""

    name: str  # `<source>-<k>`: the file's stem in units/, attributes/ and the arm
    source: str
    file: DataFile
    spec: FileSpec
    source_files: int = 1  # how many files the source has (units `<source>-0` ... `<source>-<n-1>`)

    def documents(self):
        """The file's documents in order, refused as `prepare` refuses them (`checked_documents`)."""
        return checked_documents(self.file, self.spec)


def unit_name(source: str, k: int) -> str:
    return f"{source}-{k:05d}"


def units_of(manifest: Manifest) -> list[Unit]:
    return [Unit(unit_name(ds.name, k), ds.name, f, ds.spec(f), len(ds.files)) for ds in manifest.sources
            for k, f in enumerate(ds.files)]


def source_of(manifest: Manifest, name: str) -> DocumentSet:
    return next(ds for ds in manifest.sources if ds.name == name)


def write_npz(path: Path, **arrays: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def str_arrays(name: str, values: list[str]) -> dict[str, np.ndarray]:
    """`values` for `write_npz` as the str array `name`, kept exactly: NumPy's str arrays drop a string's
    trailing NULs (an id `"d1\\u0000"` in JSON), so where a value ends in any, their counts are kept beside it
    (`<name>__trailing_nuls`) and `read_npz` puts them back."""
    arrays = {name: np.array(values, dtype=str)}
    nuls = np.array([len(v) - len(v.rstrip("\0")) for v in values], dtype=np.int64)
    if nuls.any():
        arrays[name + TRAILING_NULS] = nuls
    return arrays


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an npz file; a str array `str_arrays` wrote with trailing NULs as its exact values."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for key in [k for k in arrays if k.endswith(TRAILING_NULS)]:
        name = key[:-len(TRAILING_NULS)]
        arrays[name] = _with_nuls(arrays[name], arrays.pop(key))
    return arrays


def _with_nuls(values: np.ndarray, nuls: np.ndarray) -> np.ndarray:
    """The strings `values` with `nuls` NULs put back at their ends (an object array of str, in memory only)."""
    return np.array([v + "\0" * k for v, k in zip(values.tolist(), nuls.tolist())], dtype=object)


def read_parts(paths: list[Path], names: tuple[str, ...], dtypes: tuple) -> dict[str, np.ndarray]:
    """The concatenation of the arrays `names` over the files `paths` (empty arrays of `dtypes` for none)."""
    parts = [read_npz(p) for p in paths]
    return {n: np.concatenate([p[n] for p in parts]) if parts else np.zeros(0, dtype=d) for n, d in zip(names, dtypes)}


class Store:
    """Paths and markers of one curation directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def meta_path(self) -> Path:
        return self.root / META

    def meta(self) -> dict:
        if not self.meta_path.is_file():
            raise DataInputError("is not a curation directory (no curation.json): run `ladder data curate` first",
                                 where=str(self.root))
        return json.loads(self.meta_path.read_text())

    def write_meta(self, meta: dict) -> None:
        atomic_write_json(self.meta_path, meta)

    def manifest_path(self, meta: dict | None = None) -> Path:
        """The curated manifest: its recorded path, or where it sits relative to this directory after the two
        were moved together (`rungs.data.relocation`)."""
        meta = self.meta() if meta is None else meta
        return located(meta["manifest"], meta.get(MANIFEST_RELATIVE), self.root)

    def records(self, meta: dict, manifest: Manifest) -> bool:
        """Whether `meta` is a curation of `manifest` (the same file, moved or not)."""
        return bool(meta.get("manifest")) and same_file(self.manifest_path(meta), manifest.path)

    def open_for_writing(self, manifest: Manifest, key: str) -> dict:
        """The directory's metadata, created for `manifest` if the directory is new or empty; refused if it
        holds anything else, or a curation of another manifest (or of this one since edited, unless that one
        finished no tagger: it then starts over, its own files removed)."""
        root = self.root
        if root.exists() and not root.is_dir():
            raise DataInputError("exists and is not a directory", where=str(root), field="--out")
        if root.is_dir() and any(root.iterdir()) and not self.meta_path.is_file():
            raise DataInputError("is not empty and holds no curation.json: refusing to write into a directory "
                                 "curate did not create (choose an empty or new --out)", where=str(root), field="--out")
        if self.meta_path.is_file():
            meta = self.meta()
            if meta.get("manifest_key") == key:
                remove_stale_temporaries(root, WRITTEN_FOLDERS)
                if meta.get("manifest") != str(manifest.path) and self.records(meta, manifest):
                    meta.update(self._manifest_fields(manifest))  # moved with its manifest: record where it is now
                    self.write_meta(meta)
                return meta
            finished = [name for name, t in meta.get("taggers", {}).items() if t.get("done")]
            if not self.records(meta, manifest) or finished:
                raise DataInputError(f"holds a curation of another manifest ({meta.get('manifest')}) or of this one "
                                     "before an edit: choose a new --out", where=str(root), field="--out")
            # This manifest's, edited since (a file fixed after curate refused it): no tagger finished, so
            # nothing here is worth keeping, and what is here describes the old files.
            log.info("curate: %s changed since %s began and no tagger finished there: starting over", manifest.path,
                     root)
            for folder in OWN_FOLDERS:
                shutil.rmtree(root / folder, ignore_errors=True)
            self.meta_path.unlink()
            remove_stale_temporaries(root, WRITTEN_FOLDERS)
        root.mkdir(parents=True, exist_ok=True)
        return {"format_version": FORMAT_VERSION, **self._manifest_fields(manifest), "manifest_key": key,
                "taggers": {}}

    def _manifest_fields(self, manifest: Manifest) -> dict:
        return {"manifest": str(manifest.path), MANIFEST_RELATIVE: relative_to_dir(manifest.path, self.root)}

    def unit_index(self, unit: str) -> Path:
        return self.root / "units" / f"{unit}.npz"

    def attributes(self, tagger: str, unit: str) -> Path:
        return self.root / "attributes" / tagger / f"{unit}.npz"

    def work(self, tagger: str) -> Path:
        return self.root / "work" / tagger

    def marker(self, stage: str, task: str) -> Path:
        return self.root / "done" / stage / f"{task}.json"

    def done(self, stage: str, task: str) -> dict | None:
        path = self.marker(stage, task)
        return json.loads(path.read_text()) if path.is_file() else None

    def mark(self, stage: str, task: str, result: dict) -> None:
        path = self.marker(stage, task)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, result)


def write_unit_index(store: Store, unit: Unit, docs: list[Document]) -> None:
    """units/<unit>.npz: written by whichever tagger reads the file first (the same bytes every time); then the
    source's ids are checked across its files (`check_source_ids`)."""
    from curation.ids import doc_uids

    path = store.unit_index(unit.name)
    if not path.is_file():
        ids = [d.doc_id for d in docs]
        write_npz(path, uid=doc_uids(unit.source, ids), **str_arrays("id", ids),
                  bytes=np.array([len(d.text.encode()) for d in docs], dtype=np.int64),
                  words=np.array([len(d.text.split()) for d in docs], dtype=np.int64))
    check_source_ids(store, unit)


def check_source_ids(store: Store, unit: Unit) -> None:
    """Refuse an id that two files of `unit`'s source share, as `prepare` does (each file's own ids are checked
    as it is read): a DataInputError naming the later file, with `prepare`'s message.

    Run by each task after it wrote its unit index, so the task that indexes a source's last file (a few, if
    they finish together; in any order, in any process) finds every index there and checks them all: their
    uids (64-bit hashes of source and id, 8 bytes a document) sorted, and the ids of equal uids compared. A
    marker spares the tasks after it; a task that refused keeps no marker, so a rerun refuses again."""
    if unit.source_files <= 1 or store.done(IDS_CHECKED, unit.source) is not None:
        return
    paths = [store.unit_index(unit_name(unit.source, k)) for k in range(unit.source_files)]
    if not all(p.is_file() for p in reversed(paths)):  # the last first: tasks start in file order
        return  # a file not indexed yet: the task that indexes it checks
    flat = np.concatenate([_index_array(p, "uid") for p in paths])
    docs = len(flat)
    flat.sort()
    shared = np.unique(flat[1:][flat[1:] == flat[:-1]])
    del flat
    if len(shared):  # the ids of the shared uids, in file order: the first one met again is named
        seen: dict[int, set[str]] = {}
        for k, p in enumerate(paths):
            uid = _index_array(p, "uid")
            rows = np.flatnonzero(np.isin(uid, shared))
            if not len(rows):
                continue
            ids = _index_array(p, "id")
            for r in rows.tolist():
                doc_id = str(ids[r])
                if doc_id in seen.setdefault(int(uid[r]), set()):
                    raise DataInputError(duplicate_id(doc_id), where=str(_source_file(store, unit, k)),
                                         field=unit.source)
                seen[int(uid[r])].add(doc_id)  # another id of the same uid: a collision, not a repeat
    store.mark(IDS_CHECKED, unit.source, {"files": len(paths), "docs": docs})


def _index_array(path: Path, name: str) -> np.ndarray:
    with np.load(path, allow_pickle=False) as z:
        if name + TRAILING_NULS in z.files:
            return _with_nuls(z[name], z[name + TRAILING_NULS])
        return z[name]


def _source_file(store: Store, unit: Unit, k: int) -> DataFile:
    """The k-th file of `unit`'s source (read from the curated manifest unless it is the unit's own)."""
    if unit.name == unit_name(unit.source, k):
        return unit.file
    return source_of(load_manifest(store.manifest_path()), unit.source).files[k]
