"""Build the independent-check corpus (`rungs/data/machine_corpus/`) from freely licensed text on this machine.

The demo corpus (`rungs/data/demo/`) is what the demo recipe's shape was tuned on. This corpus is a
second, independent test bed for the same recipe: five domains the demo does not use, taken from text
that a Debian system with the project's virtual environment already has, so no download is needed:

- pycode: Python source of third-party packages in the venv (networkx, click, rich, attrs, requests,
  jinja2, pygments, packaging), not CPython's standard library (the demo's code);
- changelog: Debian package changelogs, `/usr/share/doc/PKG/changelog.Debian.gz`;
- licence: licence texts, `/usr/share/common-licenses/*`, the licence files in the venv's
  `*.dist-info` folders and Debian's per-package `/usr/share/doc/PKG/copyright` files;
- readme: package long descriptions (README, Markdown or reST), the bodies of the venv's
  `*.dist-info/METADATA`;
- manpage: section-1 manual pages of git, dpkg and OpenSSL, rendered to plain text with `man -l`.

Run once by a maintainer; the output (about 1.6 MB of gzipped JSONL) is committed:

    .venv/bin/python scripts/build_machine_corpus.py

Documents are paragraph-aligned chunks of at most 1,500 characters. The held-out set of a domain takes
whole origins (a source file, a package's changelog, a licence file, a package's README, a manual page)
in the order of a hash of their name, until it has at least 5% of the domain's training bytes and 45
documents; training never holds a document of a held-out origin. Exact duplicates are dropped (within
the corpus, and any document whose text is in the demo corpus), licences are also deduplicated after
removing copyright lines and whitespace (the MIT text of 40 packages is one document), a document half
of whose word 13-grams are already in its domain's kept documents is dropped as a near duplicate (this
runs in origin order, before the split), and at build time
training documents sharing a lower-cased word 13-gram with a held-out document of the same domain are
dropped (`ladder data prepare` repeats the check across all domains). E-mail addresses become `[email]`.
"""

from __future__ import annotations

import argparse
import email
import gzip
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from rungs.data.decontam import ngram_hashes
from rungs.data.chunking import paragraph_chunks

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "rungs" / "data" / "machine_corpus"
DEMO = ROOT / "rungs" / "data" / "demo" / "corpus"
SITE = ROOT / ".venv" / "lib" / "python3.11" / "site-packages"
MAX_DOC_CHARS = 1_500
NEAR_DUP = 0.5  # a document with this fraction of its word 13-grams already kept in its domain is dropped
NGRAM_WORDS = 13
EVAL_FRACTION = 0.05
EVAL_MIN_DOCS = 45

TRAIN_BYTES = {"pycode": 1_000_000, "changelog": 1_000_000, "licence": 800_000, "readme": 1_000_000,
               "manpage": 1_000_000}

CODE_PACKAGES = {  # package: licence (from its dist-info)
    "networkx": "BSD-3-Clause", "click": "BSD-3-Clause", "rich": "MIT", "attr": "MIT", "requests": "Apache-2.0",
    "jinja2": "BSD-3-Clause", "pygments": "BSD-2-Clause", "packaging": "Apache-2.0 OR BSD-2-Clause"}
MAN_PACKAGES = {"git-man": "GPL-2", "dpkg": "GPL-2+", "dpkg-dev": "GPL-2+", "openssl": "Apache-2.0"}
# Packages whose text the demo already uses (its stem and math sources are SciPy and SymPy documentation),
# and NVIDIA's CUDA wheels, whose READMEs and licence files are under NVIDIA's proprietary licence.
SKIPPED_PACKAGES = ("scipy", "sympy", "mpmath", "nvidia", "cuda")

EMAIL_RE = re.compile(r"[\w.+\-=]+@[\w\-]+(\.[\w\-]+)+")
SPACE_RE = re.compile(r"[ \t]+\n")
DROPPED: dict[str, dict[str, int]] = {}


def clean(text: str) -> str:
    text = EMAIL_RE.sub("[email]", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = SPACE_RE.sub("\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def demo_hashes() -> set[str]:
    out = set()
    for path in DEMO.glob("*.jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            out.update(text_hash(json.loads(line)["text"]) for line in f)
    return out


# ---- domains: each yields (origin, text) ----

def pycode_groups() -> Iterator[tuple[str, str]]:
    for package in CODE_PACKAGES:
        for path in sorted((SITE / package).rglob("*.py")):
            rel = path.relative_to(SITE)
            if any(p in ("tests", "test", "testing") for p in rel.parts) or path.stat().st_size > 200_000:
                continue
            yield f"{rel}", path.read_text(encoding="utf-8", errors="replace")


def changelog_groups() -> Iterator[tuple[str, str]]:
    for path in sorted(Path("/usr/share/doc").glob("*/changelog.Debian.gz")):
        if path.is_symlink():
            continue
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            yield f"debian-changelog/{path.parent.name}", f.read()


def _dist_infos() -> list[Path]:
    return sorted(d for d in SITE.glob("*.dist-info")
                  if not d.name.lower().startswith(SKIPPED_PACKAGES) and "scaling_ladder" not in d.name)


def licence_groups() -> Iterator[tuple[str, str]]:
    for path in sorted(Path("/usr/share/common-licenses").iterdir()):
        if path.is_file() and not path.is_symlink():
            yield f"common-licenses/{path.name}", path.read_text(encoding="utf-8", errors="replace")
    for dist in _dist_infos():
        for path in sorted(dist.rglob("*")):
            if path.is_file() and re.search(r"LICEN[CS]E|COPYING|NOTICE", path.name.upper()):
                yield f"dist-info/{path.relative_to(SITE)}", path.read_text(encoding="utf-8", errors="replace")
    for path in sorted(Path("/usr/share/doc").glob("*/copyright")):
        if not path.is_symlink():
            yield f"debian-copyright/{path.parent.name}", path.read_text(encoding="utf-8", errors="replace")


def readme_groups() -> Iterator[tuple[str, str]]:
    for dist in _dist_infos():
        meta = dist / "METADATA"
        if not meta.exists():
            continue
        body = email.message_from_bytes(meta.read_bytes()).get_payload()
        if isinstance(body, str) and len(body) >= 300:
            yield f"metadata/{dist.name.split('-')[0]}", body


def man_pages() -> list[tuple[str, Path]]:
    pages = []
    for package in MAN_PACKAGES:
        listed = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=True).stdout
        pages += [(package, Path(p)) for p in listed.split() if re.search(r"/usr/share/man/man1/[^/]+\.1\w*\.gz$", p)]
    return sorted(set(pages), key=lambda t: str(t[1]))


def manpage_groups() -> Iterator[tuple[str, str]]:
    for package, path in man_pages():
        if not path.exists():
            continue
        rendered = subprocess.run(["man", "-l", str(path)], capture_output=True, check=False,
                                  env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
                                       "MAN_KEEP_FORMATTING": "", "GROFF_NO_SGR": "1"}).stdout
        text = subprocess.run(["col", "-bx"], input=rendered, capture_output=True, check=True).stdout
        yield f"man1/{package}/{path.name.removesuffix('.gz')}", text.decode("utf-8", errors="replace")


# Licence texts differ between packages mostly in their copyright lines: those and the whitespace are
# left out of the key a licence is deduplicated on.
_COPYRIGHT_LINE = re.compile(r"^.*(copyright|\(c\)|©|all rights reserved).*$", re.I | re.M)


def dedup_key(domain: str, text: str) -> str:
    if domain == "licence":
        text = " ".join(_COPYRIGHT_LINE.sub("", text).lower().split())
    return text_hash(text)


# ---- split and write ----

def split_domain(name: str, groups: Iterator[tuple[str, str]], train_bytes: int, seen: set[str],
                 demo: set[str]) -> tuple[list, list, list]:
    """Hold out whole origins (hash order) until EVAL_FRACTION of train_bytes and EVAL_MIN_DOCS, then train."""
    drops = DROPPED.setdefault(name, {"duplicate": 0, "in_demo": 0, "decontamination": 0})
    by_origin = []
    seen_grams: set = set()
    for origin, text in groups:
        docs = []
        for i, piece in enumerate(paragraph_chunks(clean(text), MAX_DOC_CHARS)):
            if text_hash(piece) in demo:
                drops["in_demo"] += 1
                continue
            key = dedup_key(name, piece)
            grams = ngram_hashes(piece, NGRAM_WORDS)
            if key in seen or (grams and len(grams & seen_grams) >= NEAR_DUP * len(grams)):
                drops["duplicate"] += 1
                continue
            seen.add(key)
            seen_grams |= grams
            docs.append({"id": f"{origin}#{i}", "text": piece})
        if docs:
            by_origin.append((text_hash(origin), origin, docs))
    by_origin.sort()
    held_out, train, origins = [], [], set()
    eval_bytes = EVAL_FRACTION * train_bytes
    taken = 0
    for _, origin, docs in by_origin:
        if len(held_out) >= EVAL_MIN_DOCS and sum(len(d["text"].encode()) for d in held_out) >= eval_bytes:
            break
        held_out.extend(docs)
        origins.add(package(origin))
        taken += 1
    held_ngrams = set().union(*(ngram_hashes(d["text"], NGRAM_WORDS) for d in held_out))
    total = 0
    for _, origin, docs in by_origin[taken:]:
        if total >= train_bytes:
            break
        for d in docs:
            if total >= train_bytes:  # a long origin (a copyright file listing hundreds of files) is cut
                break
            if ngram_hashes(d["text"], NGRAM_WORDS) & held_ngrams:
                drops["decontamination"] += 1
                continue
            train.append(d)
            total += len(d["text"].encode())
            origins.add(package(origin))
    return train, held_out, sorted(origins)


def write_if_changed(path: Path, data: bytes) -> None:
    """Rewrite a file only when its bytes change: a prepared corpus's cache key includes file mtimes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)


def write_jsonl_gz(path: Path, docs: list[dict]) -> None:
    payload = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode()
    write_if_changed(path, gzip.compress(payload, compresslevel=9, mtime=0))


def package(origin: str) -> str:
    """The package (or licence file) an origin comes from, for NOTICE.md's licence list."""
    parts = origin.split("/")
    if parts[0] == "dist-info":
        return parts[1].split("-")[0]
    if parts[0] in ("debian-changelog", "debian-copyright", "metadata", "man1"):
        return parts[1]
    if parts[0] == "common-licenses":
        return origin
    return parts[0]


def write_manifest(summary: dict) -> None:
    """Shares proportional to each domain's training bytes, in hundredths summing to 1."""
    total = sum(s["train_bytes"] for s in summary.values())
    shares = {n: round(100 * s["train_bytes"] / total) for n, s in summary.items()}
    largest = max(shares, key=shares.get)
    shares[largest] += 100 - sum(shares.values())
    lines = [
        "# The independent-check corpus: freely licensed text found on a Debian machine with the project's venv",
        "# (see NOTICE.md), built by scripts/build_machine_corpus.py. No domain is one the demo corpus uses.",
        "# Shares are proportional to each domain's training bytes.",
        "name: machine_corpus",
        "description: independent-check corpus (third-party Python source, Debian changelogs, licence texts,"
        " package READMEs, manual pages)",
        "sources:",
        *(f"  - {{name: {n}, domain: {n}, share: {shares[n] / 100:.2f}, files: [corpus/{n}.jsonl.gz]}}" for n in summary),
        "eval:",
        *(f"  - {{domain: {n}, files: [corpus/eval_{n}.jsonl.gz]}}" for n in summary),
        "decontamination: {ngram_words: 13}",
    ]
    write_if_changed(OUT / "manifest.yaml", ("\n".join(lines) + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    domains = {"pycode": pycode_groups, "changelog": changelog_groups, "licence": licence_groups,
               "readme": readme_groups, "manpage": manpage_groups}
    demo = demo_hashes()
    summary = {}
    for name, groups in domains.items():
        train, held_out, origins = split_domain(name, groups(), TRAIN_BYTES[name], set(), demo)
        write_jsonl_gz(OUT / "corpus" / f"{name}.jsonl.gz", train)
        write_jsonl_gz(OUT / "corpus" / f"eval_{name}.jsonl.gz", held_out)
        summary[name] = {"train_docs": len(train), "train_bytes": sum(len(d["text"].encode()) for d in train),
                         "eval_docs": len(held_out), "eval_bytes": sum(len(d["text"].encode()) for d in held_out),
                         "eval_origins": len({d["id"].rsplit("#", 1)[0] for d in held_out}),
                         "origins": origins, "dropped": DROPPED[name]}
        sys.stderr.write(f"{name}: { {k: v for k, v in summary[name].items() if k != 'origins'} }\n")
    write_if_changed(OUT / "corpus" / "build_summary.json", (json.dumps(summary, indent=1) + "\n").encode())
    write_manifest(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
