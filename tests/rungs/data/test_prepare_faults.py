"""Faults during prepare: a full disk and a SIGKILL leave nothing half-written, and a rerun completes to
byte-identical output."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ladder.cli import main
from rungs.data.prepare import prepare

from .conftest import make_docs, write_jsonl, write_manifest

REPO = Path(__file__).resolve().parents[3]


def _files(root: Path) -> dict[str, bytes]:
    """Every file's bytes; progress.json's without the manifest's path from `root` (it depends on where `root` is)."""
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    if "progress.json" in files:
        progress = json.loads(files["progress.json"])
        progress.pop("manifest_relative", None)
        files["progress.json"] = json.dumps(progress, sort_keys=True).encode()
    return files


def _temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".tmp" in p.name]


def _big_manifest(root: Path) -> Path:
    """The tiny corpus with source a at ~600 KB of text: its byte-token shard alone is ~1.2 MB."""
    manifest = write_manifest(root)
    write_jsonl(root / "a.jsonl", make_docs("a", 1_200, seed=1, min_words=60, max_words=120))
    return manifest


def test_a_full_disk_says_so_leaves_no_temporary_and_a_rerun_completes_identically(tmp_path, capsys):
    """A real full disk: the output directory on a 1 MiB tmpfs (needs root and mount; else skipped)."""
    manifest = _big_manifest(tmp_path / "corpus")
    reference = prepare(manifest, tmp_path / "reference", vocab_size=257, tokenizer="byte")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}); "
                    "test_disk_full_at_a_shard_write covers the same path by injection")
    try:
        out = mnt / "out"
        assert main(["data", "prepare", str(manifest), "--out", str(out), "--tokenizer", "byte", "--vocab-size", "257"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert f"ladder data: error: disk full writing {out}/train/a/00000-0000.tokens.npy (No space left on device)" in err
        assert _temporaries(out) == [] and not (out / "train" / "a" / "00000-0000.tokens.npy").exists()
        assert not (out / "meta.json").exists()
        subprocess.run(["mount", "-o", "remount,size=16m", str(mnt)], check=True)
        assert main(["data", "prepare", str(manifest), "--out", str(out), "--tokenizer", "byte", "--vocab-size", "257"]) == 0
        assert _files(out) == _files(reference)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _matches(path, target: str) -> bool:
    """`target` is a file name, or 'dir/name' (a shard: 'b/00000-0000.tokens.npy'); temporaries match too."""
    where, _, name = target.rpartition("/")
    p = Path(path)
    return name in p.name and (not where or str(p.parent).endswith("/" + where))


class _FullDiskAfter:
    """`open` whose first write to a file named like `name` stores half its bytes and then raises ENOSPC,
    as a filling disk does (injected as builtins.open and io.open: the test needs no mount)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.fired = False
        self.open = builtins.open

    def __call__(self, path, mode="r", *args, **kwargs):
        f = self.open(path, mode, *args, **kwargs)
        if self.fired or not isinstance(path, (str, os.PathLike)) or not _matches(path, self.name) or "w" not in mode:
            return f
        self.fired = True
        outer = self

        class Partial:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

            def write(self, data):
                f.write(data[:len(data) // 2])
                f.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        outer.partial = Partial()
        return outer.partial


def test_disk_full_at_a_shard_write(tmp_path, capsys, monkeypatch):
    manifest = write_manifest(tmp_path / "corpus")
    reference = prepare(manifest, tmp_path / "reference", vocab_size=300)
    out = tmp_path / "out"
    fault = _FullDiskAfter("b/00000-0000.tokens.npy")
    monkeypatch.setattr(builtins, "open", fault)
    monkeypatch.setattr(io, "open", fault)
    assert main(["data", "prepare", str(manifest), "--out", str(out), "--vocab-size", "300"]) == 1
    assert fault.fired
    err = capsys.readouterr().err
    assert err == f"ladder data: error: disk full writing {out}/train/b/00000-0000.tokens.npy (No space left on " \
                  f"device); free space on {out}/train/b and rerun: finished steps are kept\n"
    assert _temporaries(out) == [] and not (out / "train" / "b" / "00000-0000.tokens.npy").exists()
    assert (out / "train" / "a" / "00000-0000.tokens.npy").exists() and not (out / "meta.json").exists()
    monkeypatch.undo()
    assert main(["data", "prepare", str(manifest), "--out", str(out), "--vocab-size", "300"]) == 0
    assert _files(out) == _files(reference)


_KILLED = textwrap.dedent("""
    import builtins, io, os, signal, sys
    from pathlib import Path
    from rungs.data.prepare import prepare

    manifest, out, target, inside = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "inside"
    real_open = builtins.open

    def open_then_die(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        where, _, name = target.rpartition("/")
        if not isinstance(path, (str, os.PathLike)) or name not in Path(path).name or "w" not in mode \
                or (where and not str(Path(path).parent).endswith("/" + where)):
            return f
        if not inside:  # between files: the previous step is on disk, this one never starts
            os.kill(os.getpid(), signal.SIGKILL)

        class HalfThenDie:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                pass

            def write(self, data):
                f.write(data[:len(data) // 2])
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)

        return HalfThenDie()

    builtins.open = io.open = open_then_die
    prepare(manifest, out, vocab_size=300)
""")


@pytest.mark.parametrize("target,where", [("b/00000-0000.tokens.npy", "inside"), ("x/00000-0000.tokens.npy", "between"),
                                          ("tokenizer.json", "inside")])
def test_a_prepare_killed_mid_way_reruns_to_byte_identical_output(target, where, tmp_path):
    manifest = write_manifest(tmp_path / "corpus")
    reference = prepare(manifest, tmp_path / "reference", vocab_size=300)
    out = tmp_path / "out"
    killed = subprocess.run([sys.executable, "-c", _KILLED, str(manifest), str(out), target, where], cwd=REPO,
                            capture_output=True, text=True, timeout=3600)  # a far guard
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / "meta.json").exists() and not any(_matches(p, target) and ".tmp" not in p.name
                                                          for p in out.rglob("*"))
    if where == "inside":  # the half-written temporary is there, hidden, until the next run
        assert [p.name.split(".tmp")[0] for p in _temporaries(out)] == [f".{target.rpartition('/')[2]}"]
    assert main(["data", "prepare", str(manifest), "--out", str(out), "--vocab-size", "300"]) == 0
    assert _temporaries(out) == []
    assert _files(out) == _files(reference)
    assert json.loads((out / "meta.json").read_text())["key"] == json.loads((reference / "meta.json").read_text())["key"]
