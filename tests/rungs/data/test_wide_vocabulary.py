"""Vocabularies over 65,536 entries: uint32 shards, ids range-checked before anything is written."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ladder.cli import main
from rungs.data.bpb import evaluate_bpb
from rungs.data.corpus import PreparedCorpus
from rungs.data.errors import DataInputError
from rungs.data.prepare import tokenize_documents
from rungs.data.sampler import SourceScaledSampler
from rungs.data.tokenizer import TokenIdError, ids_array, token_dtype, train_bpe

from .conftest import demo_words, make_docs, write_jsonl, write_manifest
from .test_sampler import plan_for

VOCAB = 131_072  # the mai-base-2 recipe's vocabulary: a small BPE plus added tokens up to exactly this size
BASE_BPE = 300
ADDED = VOCAB - BASE_BPE  # `<w0>`..`<w130771>`: ids up to 131,071


@pytest.fixture(scope="module")
def wide_tokenizer(tmp_path_factory):
    """A real byte-level BPE plus added tokens `<w0>`..: 131,072 entries, saved as a tokenizer.json."""
    tok = train_bpe([" ".join(demo_words()[:5_000])], BASE_BPE)
    tok.hf.add_tokens([f"<w{i}>" for i in range(ADDED)])
    assert tok.hf.get_vocab_size() == VOCAB
    path = tmp_path_factory.mktemp("wide") / "tokenizer.json"
    tok.hf.save(str(path))
    return path, tok.hf.get_vocab_size()


def _with_added_tokens(docs: list[dict], seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    for d in docs:
        words = d["text"].split(" ")
        for k in rng.choice(len(words), size=3, replace=False):
            words[k] = f"<w{rng.integers(ADDED - 500, ADDED)}>"  # ids 130,572..131,071, far above 65,535
        d["text"] = " ".join(words)
    return docs


@pytest.fixture(scope="module")
def wide_corpus(wide_tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("wide_corpus")
    manifest = write_manifest(root)
    write_jsonl(root / "a.jsonl", _with_added_tokens(make_docs("a", 60, seed=1), seed=1))
    write_jsonl(root / "held" / "x.jsonl", _with_added_tokens(make_docs("x", 12, seed=3, span=(12_000, 20_000)), 3))
    out = root / "out"
    assert main(["data", "prepare", str(manifest), "--out", str(out), "--tokenizer", str(wide_tokenizer[0]),
                 "--json"]) == 0
    return manifest, out


def test_token_dtype_follows_the_vocabulary():
    assert token_dtype(257) == np.uint16 and token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32 and token_dtype(131_072) == np.uint32


def test_a_vocabulary_over_65536_round_trips_text_through_uint32_shards(wide_tokenizer, wide_corpus, capsys):
    manifest, out = wide_corpus
    corpus = PreparedCorpus.open(out)
    assert corpus.meta["tokenizer"]["vocab_size"] == wide_tokenizer[1] == VOCAB
    for split, name in (("train", "a"), ("train", "b"), ("eval", "x")):
        shard = corpus.train_shard(name) if split == "train" else corpus.eval_shard(name)
        assert shard.tokens.dtype == np.uint32
        texts = [json.loads(line)["text"] for line in
                 (manifest.parent / ("held/x.jsonl" if name == "x" else f"{name}.jsonl")).read_text().splitlines()]
        assert [corpus.tokenizer.decode(shard.document_tokens(i).tolist()) for i in range(shard.n_docs)] == texts
        if name != "b":
            assert int(shard.tokens.max()) > VOCAB - 501  # the added tokens kept their ids (no wrap modulo 65,536)


def test_the_sampler_and_bpb_read_uint32_ids_unchanged(wide_corpus):
    corpus = PreparedCorpus.open(wide_corpus[1])
    sampler = SourceScaledSampler(corpus, plan_for(corpus, 0.5), seq_len=32, batch_sequences=4, seed=0)
    seen = []
    for _ in range(20):
        batch = sampler.next_batch()
        for r in range(4):
            for t in range(32):
                origin = batch.locate(r, t)
                shard = corpus.train_shard(origin.source)
                doc = shard.doc_ids.index(origin.doc_id)
                start, n, _ = shard.index[doc]
                assert int(batch.inputs[r, t]) == int(shard.tokens[start + origin.token_offset])
        seen.append(int(batch.inputs.max()))
    assert max(seen) > VOCAB - 501
    vocab = corpus.meta["tokenizer"]["vocab_size"]
    result = evaluate_bpb(lambda x: torch.zeros(*x.shape, vocab), corpus, seq_len=16, batch_size=2,
                          max_docs_per_domain=2)["x"]
    assert result.bpb == pytest.approx(result.tokens * math.log(vocab) / (math.log(2) * result.bytes), rel=1e-12)


def test_a_tokenizer_larger_than_vocab_size_is_refused_before_anything_is_written(wide_tokenizer, tmp_path, capsys):
    manifest = write_manifest(tmp_path / "corpus")
    out = tmp_path / "out"
    assert main(["data", "prepare", str(manifest), "--out", str(out), "--tokenizer", str(wide_tokenizer[0]),
                 "--vocab-size", "65536"]) == 2
    err = capsys.readouterr().err
    assert f"{wide_tokenizer[0]}: vocab_size: the tokenizer has {wide_tokenizer[1]:,} entries, more than " \
           "vocab_size 65,536" in err and err.count("\n") == 1
    assert not out.exists()


def test_an_id_outside_the_vocabulary_is_refused_not_wrapped(wide_tokenizer):
    with pytest.raises(TokenIdError, match="token id 70000 is outside the vocabulary of 65,536 entries"):
        ids_array([5, 70_000], 65_536, np.dtype(np.uint16))
    with pytest.raises(TokenIdError, match="token id -1"):
        ids_array([-1], 300, np.dtype(np.uint16))
    from tokenizers import Tokenizer

    from rungs.data.tokenizer import BpeTokenizer

    tok = BpeTokenizer(Tokenizer.from_file(str(wide_tokenizer[0])))
    tok.vocab_size = 65_536  # the model's vocabulary, smaller than what this tokenizer emits
    with pytest.raises(TokenIdError, match="outside the vocabulary of 65,536"):
        tokenize_documents(tok, ["plain words", "an added token <w65999> here"])


def test_shards_whose_ids_wrapped_into_uint16_are_refused(wide_corpus, tmp_path):
    """What numpy 1.x wrote before the fix: a >65,536-entry vocabulary's ids cast to uint16."""
    import shutil

    copy = shutil.copytree(wide_corpus[1], tmp_path / "wrapped")
    path = copy / "train" / "a" / "00000-0000.tokens.npy"
    np.save(path, np.load(path).astype(np.uint16))
    with pytest.raises(DataInputError, match=r"train/a/00000-0000\.tokens\.npy holds uint16 ids but the vocabulary has "
                                             r"131,072 entries \(needs uint32\); ids may have wrapped"):
        PreparedCorpus.open(copy).train_shard("a")


def test_a_vocab_size_too_small_for_the_byte_tokenizer_is_refused(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "corpus")
    out = tmp_path / "out"
    assert main(["data", "prepare", str(manifest), "--out", str(out), "--tokenizer", "byte",
                 "--vocab-size", "100"]) == 2
    err = capsys.readouterr().err
    assert "--vocab-size" in err and "257 ids" in err and err.count("\n") == 1
    assert not out.exists()
