"""The curation directory: its layout, its metadata, and the attribute store.

    DIR/curation.json                  what was curated (manifest, its content key, units, partitions, taggers)
    DIR/units/<unit>.npz               per training file: uid, id, bytes, words of every document, in file order
    DIR/attributes/<tagger>/<unit>.npz per tagger and file: one value per document, rows as in units/
    DIR/work/<tagger>/...              the tagger's shuffle files (partitioned keys, edges, labels)
    DIR/done/<stage>/<task>.json       completion markers: a task with a marker is never run again
    DIR/report.json, DIR/cluster_sizes.png

Every file is written through a temporary and a rename (`rungs.data.atomic`), and a task's marker only
after all its files, so a run killed at any point resumes where it was. A directory that is not empty
and holds no `curation.json` is refused: the curation only ever writes and removes its own files.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rungs.data.atomic import atomic_write_bytes, atomic_write_json, remove_stale_temporaries
from rungs.data.errors import DataInputError
from rungs.data.manifest import DocumentSet, Manifest
from rungs.data.readers import Document, FileSpec, segment_documents, whole_plan
from rungs.data.storage import DataFile

FORMAT_VERSION = 1
META = "curation.json"


@dataclass(frozen=True)
class Unit:
    """One training file: the unit of work of every per-file stage (small: it travels with each task)."""

    name: str  # `<source>-<k>`: the file's stem in units/, attributes/ and the arm
    source: str
    file: DataFile
    spec: FileSpec

    def documents(self):
        plan = whole_plan(self.file)
        yield from segment_documents(self.file, plan, plan.segments[0], self.spec, first_line=0)


def units_of(manifest: Manifest) -> list[Unit]:
    return [Unit(f"{ds.name}-{k:05d}", ds.name, f, ds.spec(f)) for ds in manifest.sources
            for k, f in enumerate(ds.files)]


def source_of(manifest: Manifest, name: str) -> DocumentSet:
    return next(ds for ds in manifest.sources if ds.name == name)


def write_npz(path: Path, **arrays: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def read_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


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

    def open_for_writing(self, manifest: Manifest, key: str) -> dict:
        """The directory's metadata, created for `manifest` if the directory is new or empty; refused if it
        holds anything else, or a curation of another manifest (or of this one since edited)."""
        root = self.root
        if root.exists() and not root.is_dir():
            raise DataInputError("exists and is not a directory", where=str(root), field="--out")
        if root.is_dir() and any(root.iterdir()) and not self.meta_path.is_file():
            raise DataInputError("is not empty and holds no curation.json: refusing to write into a directory "
                                 "curate did not create (choose an empty or new --out)", where=str(root), field="--out")
        if self.meta_path.is_file():
            meta = self.meta()
            if meta.get("manifest_key") != key:
                raise DataInputError(f"holds a curation of another manifest ({meta.get('manifest')}) or of this one "
                                     "before an edit: choose a new --out", where=str(root), field="--out")
            remove_stale_temporaries(root)
            return meta
        root.mkdir(parents=True, exist_ok=True)
        return {"format_version": FORMAT_VERSION, "manifest": str(manifest.path), "manifest_key": key, "taggers": {}}

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
    """units/<unit>.npz: written by whichever tagger reads the file first (the same bytes every time)."""
    from curation.ids import doc_uids

    path = store.unit_index(unit.name)
    if path.is_file():
        return
    ids = [d.doc_id for d in docs]
    write_npz(path, uid=doc_uids(unit.source, ids), id=np.array(ids, dtype=str),
              bytes=np.array([len(d.text.encode()) for d in docs], dtype=np.int64),
              words=np.array([len(d.text.split()) for d in docs], dtype=np.int64))
