"""What a curation found: per tagger and source the documents and bytes `keep_one` would remove, the
cluster-size histogram as a PNG in the curation directory, and samples of removed documents (refused, as
`mix` refuses, once the manifest or its files changed since they were curated)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from curation.store import Store, read_npz, units_of
from rungs.data.atomic import atomic_write_json
from rungs.data.errors import DataInputError
from rungs.data.manifest import load_manifest
from rungs.data.relocation import located

KEEP_SETS = ("exact", "near", "semantic")  # attribute sets with a `keep`: what keep_one would remove
# `mix`'s refusal of a curation whose manifest or files changed (its attributes' rows no longer match the files)
CHANGED = "the manifest or its files changed since they were curated: curate again into a new directory"


def curation_report(root: str | Path) -> dict:
    """report.json's content: per tagger with a keep decision, per source: docs, bytes, and those removed."""
    store = Store(Path(root))
    meta = store.meta()
    done = {s for t in meta["taggers"].values() if t.get("done") for s in t.get("attributes", {})}
    per_source: dict[str, dict] = {}
    for u in meta["units"]:
        index = read_npz(store.unit_index(u["unit"]))
        s = per_source.setdefault(u["source"], {"docs": 0, "bytes": 0, "words": 0})
        s["docs"] += len(index["uid"])
        s["bytes"] += int(index["bytes"].sum())
        s["words"] += int(index["words"].sum())
    steps = {}
    for name in (n for n in KEEP_SETS if n in done):
        rows = {}
        for u in meta["units"]:
            index = read_npz(store.unit_index(u["unit"]))
            removed = ~read_npz(store.attributes(name, u["unit"]))["keep"]
            r = rows.setdefault(u["source"], {"docs_removed": 0, "bytes_removed": 0, "words_removed": 0})
            r["docs_removed"] += int(removed.sum())
            r["bytes_removed"] += int(index["bytes"][removed].sum())
            r["words_removed"] += int(index["words"][removed].sum())
        steps[name] = rows
    sizes = {t: meta["taggers"][t]["cluster_sizes"] for t in ("exact", "near") if t in meta["taggers"]
             and "cluster_sizes" in meta["taggers"][t]}
    return {"dir": str(store.root), "manifest": str(store.manifest_path(meta)), "sources": per_source, "steps": steps,
            "cluster_sizes": sizes, "taggers": {t: {k: v for k, v in s.items() if k != "units"}
                                                for t, s in meta["taggers"].items()}}


def write_report(root: str | Path) -> dict:
    report = curation_report(root)
    store = Store(Path(root))
    atomic_write_json(store.root / "report.json", report)
    if report["cluster_sizes"]:
        report["plot"] = str(plot_cluster_sizes(report["cluster_sizes"], store.root / "cluster_sizes.png"))
    return report


def plot_cluster_sizes(sizes: dict[str, dict[str, int]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rungs.data.atomic import atomic_write_bytes

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for tagger, hist in sizes.items():
        if hist:
            x = np.array([int(k) for k in hist])
            ax.plot(x, [hist[k] for k in hist], "o-", label=f"{tagger} ({sum(hist.values())} clusters)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cluster size (documents)")
    ax.set_ylabel("clusters")
    ax.set_title("duplicate clusters by size")
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def removed_samples(directory: str | Path, step: str, n: int, chars: int = 300) -> dict:
    """`n` documents a step removed, spread evenly over them, each with the document its cluster kept where
    there is one. `directory`: a curation directory (`step`: exact, near or semantic: what keep_one removes)
    or an arm (`step`: one of its rules)."""
    directory = Path(directory)
    arm = directory / "arm.json"
    if arm.is_file():
        import json

        payload = json.loads(arm.read_text())
        if payload.get("incomplete"):
            raise DataInputError("a mix into this arm did not finish: mix it again", where=str(directory))
        store = Store(located(payload["curation"], payload.get("curation_relative"), directory))
        path = directory / "removed" / f"{step}.npz"
        rules = [s["rule"] for s in payload["steps"]]
        if step not in rules or not path.is_file():
            raise DataInputError(f"the arm has no rule {step!r}; its rules: {rules}", where=str(directory),
                                 field="--removed")
        picks = read_npz(path)
        meta = store.meta()
        pairs = list(zip(picks["unit"].tolist(), picks["row"].tolist()))
        # What the arm had removed once this step was done: its kept copy of a cluster is the member left, which
        # is not always the tagger's choice (mix keeps another where an earlier rule removed that one).
        gone: set[tuple[int, int]] | None = set()
        for rule in rules[:rules.index(step) + 1]:
            removed = read_npz(directory / "removed" / f"{rule}.npz")
            gone |= set(zip(removed["unit"].tolist(), removed["row"].tolist()))
    else:
        gone = None
        store = Store(directory)
        meta = store.meta()
        done = {s for t in meta["taggers"].values() if t.get("done") for s in t.get("attributes", {})}
        if step not in KEEP_SETS or step not in done:
            raise DataInputError(f"no removal step {step!r} here; this curation's: "
                                 f"{[s for s in KEEP_SETS if s in done]}", where=str(directory), field="--removed")
        pairs = [(k, int(r)) for k, u in enumerate(meta["units"])
                 for r in np.flatnonzero(~read_npz(store.attributes(step, u["unit"]))["keep"])]
    manifest = load_manifest(store.manifest_path(meta))
    if manifest.content_hash() != meta["manifest_key"]:  # the rows are positions in the files as curated (as mix)
        raise DataInputError(CHANGED, where=str(manifest.path))
    units = units_of(manifest)
    k = min(n, len(pairs))
    chosen = [pairs[round(i * (len(pairs) - 1) / max(k - 1, 1))] for i in range(k)]
    cluster_set = step if step in KEEP_SETS else {"exact_duplicates": "exact", "near_duplicates": "near",
                                                   "semantic_duplicates": "semantic"}.get(step)
    samples = []
    for unit_no, row in dict.fromkeys(chosen):
        unit = units[unit_no]
        sample = {"source": unit.source, **_document(store, unit, row, chars)}
        if cluster_set is not None:
            rep = int(read_npz(store.attributes(cluster_set, unit.name))["cluster"][row])
            sample["kept"] = _find_kept(store, units, cluster_set, rep, chars, gone)
        samples.append(sample)
    return {"dir": str(directory), "step": step, "removed": len(pairs), "samples": samples}


def _document(store: Store, unit, row: int, chars: int) -> dict:
    """The `row`-th document of `unit`'s file, refused (as mix refuses it) unless it is the one curated there: an
    edit the manifest's content key does not see (`Manifest.content_hash`) moves the rows."""
    index = read_npz(store.unit_index(unit.name))
    doc = next((d for k, d in enumerate(unit.documents()) if k == row), None)
    if doc is None or doc.doc_id != index["id"][row]:
        found = f"document {row} is {doc.doc_id!r}" if doc is not None else f"has no document {row}"
        raise DataInputError(f"{found}, curated as {str(index['id'][row])!r}: the file changed since it was curated",
                             where=str(unit.file))
    return {"id": str(index["id"][row]), "bytes": int(index["bytes"][row]), "text": doc.text[:chars]}


def _find_kept(store: Store, units, cluster_set: str, cluster: int, chars: int,
               gone: set[tuple[int, int]] | None = None) -> dict | None:
    """The document `keep_one` keeps of this cluster of `cluster_set`, looked up file by file (an inspection, not
    a join) by its cluster id: in a curation, by the tagger's keep flag (an exact or near cluster's id is its kept
    document's uid, a semantic one's is a hash of its smallest id, and its kept document is SemDeDup's choice);
    in an arm, the member no rule up to this step removed (`gone`: (unit, row) pairs)."""
    for unit_no, unit in enumerate(units):
        attrs = read_npz(store.attributes(cluster_set, unit.name))
        member = attrs["cluster"] == cluster
        if gone is None:
            rows = np.flatnonzero(member & attrs["keep"])
        else:
            rows = [int(r) for r in np.flatnonzero(member) if (unit_no, int(r)) not in gone]
        if len(rows):
            return {"source": unit.source, **_document(store, unit, int(rows[0]), chars)}
    return None
