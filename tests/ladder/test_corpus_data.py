"""The `ladder data prepare` command a plan prints for a prepared directory the training job would not prepare
(ladder.plan.corpus_data.check_tokenizer) is one `prepare` accepts: run as printed, it fixes the directory."""

from __future__ import annotations

import json
import re

import pytest

from ladder.cli import main
from ladder.errors import LadderInputError
from ladder.plan.corpus_data import check_tokenizer, read_corpus
from tests.ladder.tiny_corpus import prepare_corpus, write_corpus


def _printed_fix(corpus, vocab_size: int) -> list[str]:
    """The arguments of the `ladder data prepare ...` command in the refusal (after `ladder`)."""
    with pytest.raises(LadderInputError) as err:
        check_tokenizer(corpus, vocab_size, where="r.yaml")
    command = re.search(r"run `(ladder data prepare [^`]*)`", str(err.value))
    assert command, str(err.value)
    return command.group(1).split()[1:]


def test_the_printed_prepare_command_is_accepted_for_another_vocabulary_and_for_a_changed_file(tmp_path, capsys):
    folder = tmp_path / "corpus"
    manifest = write_corpus(folder, {"prose": 0.6, "code": 0.4}, train_docs=20, eval_docs=3)
    prepared = prepare_corpus(manifest, folder / "prepared", vocab_size=300)
    # another vocabulary: prepare refuses the directory without --overwrite, so the command carries it
    argv = _printed_fix(read_corpus(prepared), 320)
    assert "--overwrite" in argv and argv[argv.index("--vocab-size") + 1] == "320"
    assert main(argv) == 0, capsys.readouterr().err
    assert check_tokenizer(read_corpus(prepared), 320, where="r.yaml") == []
    # the same vocabulary, a file changed since: prepare brings the directory up to date without the flag
    with open(folder / "train_prose.jsonl", "a") as f:
        f.write(json.dumps({"id": "prose/new", "text": "the cat runs over the stone"}) + "\n")
    argv = _printed_fix(read_corpus(prepared), 320)
    assert "--overwrite" not in argv
    assert main(argv) == 0, capsys.readouterr().err
    assert check_tokenizer(read_corpus(prepared), 320, where="r.yaml") == []
