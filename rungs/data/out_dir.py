"""Which output directories `prepare` may write into, and which files in one it may replace.

A prepare deletes only files it can prove it wrote: the files its own state (`meta.json`,
`progress.json`) names, the four files of a shard whose own record (`<stem>.json`) names that stem,
and temporaries named by its own pattern (`rungs.data.atomic.temporary_for`); `tokenizer.json` only where
that state's tokenizer is not the byte tokenizer (a byte corpus writes none: one there is a user's).
Everything else in the directory (a user's file, an input) is left alone. Before a prepare writes anything
it records the files it is about to write in `progress.json` (step `owned`), so a prepare killed halfway
leaves a directory whose every file the next one can account for.

An `--out` is refused (DataInputError on `field="out"`) when it is
- not empty and not a prepared directory (no state file of ours): it holds someone else's files;
- a prepared directory of another manifest, tokenizer or vocabulary, unless `overwrite` (the same manifest
  whose input files changed is prepared again: that is the corpus the user asked for, brought up to date);
- a directory holding a `tokenizer.json` prepare did not write, when this prepare writes one (BPE or a
  tokenizer file): prepare would replace the user's file;
- a folder that holds the manifest's input files, or the folder of an input file or a folder inside it
  (outputs would sit among the inputs). The manifest's own folder is the project's folder: a new
  subfolder of it is fine even when inputs sit beside the manifest.
"""

from __future__ import annotations

import json
from pathlib import Path

from rungs.data.errors import DataInputError
from rungs.data.manifest import Manifest
from rungs.data.shard_writer import shard_files

STATE_FILES = ("meta.json", "progress.json", "decontamination.json")  # every prepare writes these
TOKENIZER_FILE = "tokenizer.json"  # a prepare writes it unless its tokenizer is the byte tokenizer
TABLE_PARTS = ("docs", "keys", "order", "strata")
OWNED_STEP = "owned"  # progress.json's step that lists the files a prepare is about to write

__all__ = ["check_out_dir", "owned_files", "planned_files", "prepared_key", "read_state", "same_corpus", "shard_files",
           "set_table_files", "writes_tokenizer", "OWNED_STEP", "TOKENIZER_FILE"]


def read_state(path: Path) -> dict | None:
    """A state file of ours: a JSON object with a string `key`; None for anything else."""
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and isinstance(state.get("key"), str) else None


def prepared_key(out: Path) -> str | None:
    """The input key `out` was (or is being) prepared for: `meta.json`'s, else `progress.json`'s; None if
    `out` is not a prepared directory."""
    for name in ("meta.json", "progress.json"):
        state = read_state(out / name)
        if state is not None:
            return state["key"]
    return None


def set_table_files(split: str, name: str) -> list[str]:
    """The set's document table files a prepare writes (relative to `out`): a held-out set's `.docs.npy`
    alone, a training source's also its keys, order and strata."""
    parts = TABLE_PARTS if split == "train" else ("docs",)
    return [f"{split}/{name}.{part}.npy" for part in parts]


def writes_tokenizer(state: dict) -> bool:
    """Whether the prepare a `meta.json` or `progress.json` (or the identity recorded in one) describes writes
    `tokenizer.json`: any tokenizer but the byte tokenizer (progress.json's `tokenizer`, meta.json's
    `tokenizer.kind`). Unknown: it does (what a prepare records before it writes the file says so)."""
    tokenizer = state.get("tokenizer")
    kind = tokenizer.get("kind") if isinstance(tokenizer, dict) else tokenizer
    return kind != "byte"


def _stated_files(state: dict) -> set[str]:
    """The files a `meta.json` or `progress.json` says its prepare wrote."""
    files: set[str] = set(STATE_FILES)
    if writes_tokenizer(state):
        files.add(TOKENIZER_FILE)
    entries = [("train", e) for e in state.get("sources", [])] + [("eval", e) for e in state.get("eval", [])]
    for step, info in (state.get("steps") or {}).items():
        if step == OWNED_STEP:  # a byte prepare's list claimed tokenizer.json before it was fixed: not its own
            files.update(f for f in info.get("files", []) if isinstance(f, str)
                         and (f != TOKENIZER_FILE or writes_tokenizer(state)))
        elif step.startswith(("train/", "eval/")) and isinstance(info, dict):
            split, _, name = step.partition("/")
            entries.append((split, dict(info, name=name)))
    for split, entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        files.update(set_table_files(split, entry["name"]))
        for shard in entry.get("shards", []):
            if isinstance(shard, dict) and isinstance(shard.get("stem"), str):
                files.update(shard_files(shard["stem"]))
    return files


def owned_files(out: Path) -> set[str]:
    """Paths (relative to `out`, '/'-separated) that a prepare provably wrote or was about to write; only
    for a prepared directory (an empty set otherwise). Temporaries are handled apart (by their name)."""
    states = [s for s in (read_state(out / "meta.json"), read_state(out / "progress.json")) if s is not None]
    if not states:
        return set()
    owned: set[str] = set()
    for state in states:
        owned |= _stated_files(state)
    for record in sorted(out.glob("*/*/*.json")):
        rel = record.relative_to(out).as_posix()
        if rel.split("/")[0] not in ("train", "eval") or rel.endswith(".ids.json"):
            continue
        info = read_state(record)
        if info is not None and info.get("stem") == rel.removesuffix(".json"):
            owned.update(shard_files(info["stem"]))  # a finished shard's own record names it
    return {f for f in owned if _is_inside(f)}


def _is_inside(rel: str) -> bool:
    """A relative path that stays inside the directory (a state file naming '../x' proves nothing)."""
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and "" not in parts


def planned_files(stems: list[str], sets: list[tuple[str, str]], *, tokenizer: bool) -> set[str]:
    """What a prepare of these shard stems and (split, set) pairs writes (`tokenizer`: and `tokenizer.json`)."""
    files = set(STATE_FILES) | ({TOKENIZER_FILE} if tokenizer else set())
    for stem in stems:
        files.update(shard_files(stem))
    for split, name in sets:
        files.update(set_table_files(split, name))
    return files


def _has_files(directory: Path) -> bool:
    return any(not p.is_dir() for p in directory.rglob("*"))


def same_corpus(out: Path, identity: dict) -> bool:
    """Whether `out`'s `progress.json` records this corpus (`identity`: the manifest's path, the tokenizer, the
    vocabulary): then a prepare into it needs no --overwrite, even where its input files changed."""
    progress = read_state(out / "progress.json") or {}
    return all(progress.get(field) == value for field, value in identity.items())


def check_out_dir(out: Path, manifest: Manifest, key: str, identity: dict, *, overwrite: bool) -> None:
    """Raise DataInputError (field `out`) unless `prepare` may write the corpus of `key` into `out`;
    `identity` is what progress.json records beside the key: the manifest's path, the tokenizer, the vocabulary."""
    _check_apart_from_inputs(out, manifest)
    if not out.exists() or not _has_files(out):
        return
    found = prepared_key(out)
    if found is None:
        unreadable = [name for name in ("meta.json", "progress.json") if (out / name).exists()]
        why = f" (its {' and '.join(unreadable)} cannot be read as prepare's records)" if unreadable else ""
        raise DataInputError(f"is not empty and not a prepared directory{why}; prepare writes only into a new or "
                             "empty directory or one it prepared (it never deletes files it did not write)",
                             where=str(out), field="out")
    if found != key and not same_corpus(out, identity) and not overwrite:
        meta = read_state(out / "meta.json") or {}
        source = f" from {meta['manifest']}" if isinstance(meta.get("manifest"), str) else ""
        raise DataInputError(f"holds a corpus prepared{source} for another manifest, tokenizer or vocabulary; "
                             "pass --overwrite to replace the files prepare wrote there, or name "
                             "another --out", where=str(out), field="out")
    if writes_tokenizer(identity) and (out / TOKENIZER_FILE).exists() and TOKENIZER_FILE not in owned_files(out):
        raise DataInputError(f"holds a {TOKENIZER_FILE} that prepare did not write, and this prepare writes its "
                             "tokenizer under that name; move your file elsewhere, or name another --out",
                             where=str(out), field="out")


def _check_apart_from_inputs(out: Path, manifest: Manifest) -> None:
    target = out.resolve()
    project = manifest.path.resolve().parent
    for ds in manifest.sources + manifest.eval_sets:
        for file in ds.files:
            if not isinstance(file, Path):
                continue  # an object-store URL cannot be under a local directory
            path = file.resolve()
            folder = path.parent
            inside = target == folder or (target.is_relative_to(folder) and folder != project)
            if path.is_relative_to(target) or inside:
                raise DataInputError(f"holds or sits among the manifest's input files ({file}); name an output "
                                     "directory apart from the inputs (for example a new folder beside the "
                                     "manifest)", where=str(out), field="out")
