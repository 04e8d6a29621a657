"""Bad input to the training job and its Python API: a typed error naming the problem (one line and exit
2 from the command line), never a traceback from deep inside, and never another config's or another
corpus's state taken as this job's."""

from __future__ import annotations

import json
import typing

import pytest

from ladder.cli import main
from rungs.config import TrainConfig, TrainConfigError, parse_config
from rungs.data.corpus import PreparedCorpus
from rungs.data.errors import DataInputError
from rungs.data.prepare import ensure_prepared, prepare
from rungs.data.sampler import SourceScaledSampler
from rungs.loop import CONFIG_FILE, DATA_REPORT_FILE, RESULT_FILE, TrainResult, finished_result
from rungs.run_files import CheckpointError, RunDirError, drop_jsonl_after, exclusive_run_dir
from rungs.train import train
from tests.rungs.data.conftest import make_docs, write_jsonl, write_manifest
from tests.rungs.train_helpers import DATA_CACHE, tiny_config


# --- TrainConfig: rules the model and optimizer would otherwise enforce mid-build ---

def test_a_group_size_that_does_not_divide_the_experts_is_a_config_error():
    with pytest.raises(TrainConfigError, match=r"group_size=3 must divide n_experts=8") as err:
        parse_config(tiny_config() | {"group_size": 3})
    assert not str(err.value).startswith("Value error")  # pydantic's prefix is dropped from the message
    assert parse_config(tiny_config(group_size=4)).group_size == 4


def test_an_unknown_muon_update_scale_is_a_config_error_naming_the_choices():
    from rungs.muon import CONVENTIONS

    with pytest.raises(TrainConfigError, match="original") as err:
        parse_config(tiny_config() | {"adjust_lr": "bogus"})
    assert err.value.key == "adjust_lr"
    # The config's choices are the optimizer's conventions, no more and no fewer.
    assert set(typing.get_args(TrainConfig.model_fields["adjust_lr"].annotation)) == set(CONVENTIONS)
    assert parse_config(tiny_config(adjust_lr="original")).adjust_lr == "original"


# --- the run directory and the data cache ---

def test_a_run_directory_that_is_a_file_is_refused_naming_it(tmp_path, capsys):
    blocker = tmp_path / "taken"
    blocker.write_text("not a directory")
    for run_dir in (blocker, blocker / "below"):
        with pytest.raises(RunDirError, match="is a file"):
            with exclusive_run_dir(run_dir):
                pass
    argv = ["train", "cpu-demo", "--rung", "3", "--max-steps", "1", "--run-dir", str(blocker / "below"),
            "--set", f"data_cache_root={DATA_CACHE}", "--set", "tracking_uri="]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(blocker) in err and len(err.strip().splitlines()) == 1


def test_a_data_cache_root_that_is_a_file_is_a_data_input_error(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("")
    with pytest.raises(DataInputError, match="not a directory") as err:
        ensure_prepared(None, vocab_size=512, cache_root=blocker)
    assert err.value.field == "data_cache_root" and err.value.where == str(blocker)


def test_a_clip_event_log_cut_short_by_a_kill_is_trimmed_not_fatal_on_resume(tmp_path):
    """A kill mid-append leaves a torn last line; the resume keeps the steps its checkpoint covers."""
    log = tmp_path / "clip_events.jsonl"
    log.write_text('{"step": 0, "layer": 1}\n{"step": 1, "layer": 0}\n{"step": 2, "layer": 0}\n{"step": 2, "lay')
    drop_jsonl_after(log, 2)
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [0, 1]
    assert not (tmp_path / "clip_events.jsonl.tmp").exists()


# --- a finished job's result belongs to its config ---

def test_a_finished_job_of_another_config_is_refused_not_returned_as_this_ones(tmp_path):
    run_dir = tmp_path / "run"
    first = tiny_config(max_steps=2)
    done = train(first, run_dir=run_dir, progress=False)
    assert done.config_key == parse_config(first).key()
    assert train(first, run_dir=run_dir, progress=False).losses == done.losses  # the same config: its result
    other = first | {"lr": first["lr"] * 2}
    with pytest.raises(CheckpointError, match="another configuration"):
        train(other, run_dir=run_dir, progress=False)
    # A fresh start trains the other config, and nothing of the first job's files is left to be read as its.
    stopped = train(other, run_dir=run_dir, progress=False, resume=False, stop_after=1)
    assert stopped.steps == 1 and not (run_dir / RESULT_FILE).exists() and not (run_dir / DATA_REPORT_FILE).exists()
    assert json.loads((run_dir / CONFIG_FILE).read_text())["lr"] == other["lr"]


def test_a_stored_result_without_a_config_key_is_still_returned(tmp_path):
    """Results written before the key was recorded are returned as they were."""
    res = TrainResult(run_id=None, final_loss=1.0, bpb={"web": 2.0}, tokens=8, train_flops=1.0, wall_seconds=1.0,
                      tokens_per_second=8.0, mfu=0.1, diverged=False, steps=3)
    record = res.to_json()
    record.pop("config_key")
    (tmp_path / RESULT_FILE).write_text(json.dumps(record))
    assert finished_result(tmp_path, 3, ("abc",)) == res


# --- the sampler: its own arguments, and a state restored onto other data ---

@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory):
    """A corpus, the same inputs prepared again elsewhere, and the corpus after source a's file changed."""
    root = tmp_path_factory.mktemp("corpus")
    manifest = write_manifest(root / "in")
    original = prepare(manifest, root / "original", vocab_size=257, tokenizer="byte")
    again = prepare(manifest, root / "again", vocab_size=257, tokenizer="byte")
    write_jsonl(root / "in" / "a.jsonl", make_docs("a", 60, seed=99))
    changed = prepare(manifest, root / "changed", vocab_size=257, tokenizer="byte")
    return [PreparedCorpus.open(p) for p in (original, again, changed)]


def _plan(corpus: PreparedCorpus) -> dict:
    return {"a": {"share": 0.6, "unique_tokens": 2000, "epochs": 3},
            "b": {"share": 0.4, "unique_tokens": 1500, "epochs": 3}}


def _sampler(corpus: PreparedCorpus, **kw) -> SourceScaledSampler:
    return SourceScaledSampler(corpus, kw.pop("plan", _plan(corpus)), seq_len=16, batch_sequences=2,
                               **{"seed": 0, **kw})


def test_a_sampler_state_restores_onto_the_same_data_and_is_refused_on_changed_data(two_corpora):
    original, again, changed = two_corpora
    sampler = _sampler(original)
    for _ in range(5):
        sampler.next_batch()
    state = sampler.state_dict()
    expected = sampler.next_batch().inputs
    same = _sampler(again)  # the same inputs prepared into another directory: the same stream
    same.load_state_dict(state)
    assert same.next_batch().inputs.equal(expected)
    with pytest.raises(DataInputError, match="other training data") as err:
        _sampler(changed).load_state_dict(state)
    assert err.value.field == "sources.a" and str(changed.path) in str(err.value)
    old = {k: v for k, v in state.items() if k != "data_sha256"}  # a state saved before the data was recorded
    _sampler(changed).load_state_dict(old)


def test_a_resumed_job_on_a_corpus_prepared_again_from_changed_files_is_refused(tmp_path):
    manifest = write_manifest(tmp_path / "in")
    cfg = tiny_config(data_manifest=str(manifest), data_cache_root=str(tmp_path / "cache"), max_steps=4) | {
        "sources": {"a": {"share": 0.6, "unique_tokens": 3000, "epochs": 3},
                    "b": {"share": 0.4, "unique_tokens": 2000, "epochs": 3}}}
    assert train(cfg, run_dir=tmp_path / "run", progress=False, stop_after=2).steps == 2
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs("a", 60, seed=99))  # edited between the stop and the rerun
    with pytest.raises(DataInputError, match="other training data"):
        train(cfg, run_dir=tmp_path / "run", progress=False)


@pytest.mark.parametrize("change, match", [
    ({"chunk_tokens": -5}, "chunk_tokens must be positive"),  # never fills a batch: next_batch looped forever
    ({"seed": -1}, "seed must be a non-negative integer"),
    ({"plan": {"a": {"share": 0.6, "unique_tokens": float("inf"), "epochs": 1},
               "b": {"share": 0.4, "unique_tokens": 100, "epochs": 1}}}, "unique_tokens must be a positive finite"),
    ({"plan": {"a": {"share": 0.6, "unique_tokens": "lots", "epochs": 1},
               "b": {"share": 0.4, "unique_tokens": 100, "epochs": 1}}}, "unique_tokens must be a number"),
])
def test_sampler_arguments_that_cannot_make_a_stream_are_refused_at_construction(two_corpora, change, match):
    with pytest.raises(DataInputError, match=match):
        _sampler(two_corpora[0], **change)


# --- the sharded job's torchrun entry point ---

def test_the_sharded_entry_point_says_bad_input_in_one_line(tmp_path, capsys):
    from rungs.parallel.launch import main as launch_main

    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "partial.json").write_text('{"lr": 0.1}')
    for name, needle in (("missing.json", "missing.json"), ("bad.json", "not valid JSON"),
                         ("partial.json", "required key is missing")):
        assert launch_main(["--config", str(tmp_path / name), "--run-dir", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1
    (tmp_path / "good.json").write_text(json.dumps(tiny_config(max_steps=2)))
    (tmp_path / "taken").write_text("")
    assert launch_main(["--config", str(tmp_path / "good.json"), "--run-dir", str(tmp_path / "taken")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_the_sharded_entry_point_ends_its_process_group_on_an_input_error_found_after_it_started(
        tmp_path, capsys, monkeypatch):
    """`--ep 2` on one worker is refused by the mesh set-up, after the process group started: the
    entry point says so in one line and ends the group (a rank left in it holds its store's socket)."""
    import socket

    import torch.distributed as dist

    from rungs.parallel.launch import main as launch_main

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(port))):
        monkeypatch.setenv(name, value)
    (tmp_path / "good.json").write_text(json.dumps(tiny_config(max_steps=2)))
    try:
        code = launch_main(["--config", str(tmp_path / "good.json"), "--run-dir", str(tmp_path / "run"), "--ep", "2"])
        assert code == 2 and not dist.is_initialized()
        err = capsys.readouterr().err
        assert "must equal the world size 1" in err and len(err.strip().splitlines()) == 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_the_sharded_entry_point_prints_a_finished_jobs_result_without_a_process_group(tmp_path, capsys, monkeypatch):
    import torch.distributed as dist

    from rungs.parallel.launch import main as launch_main

    cfg = parse_config(tiny_config(max_steps=3))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    res = TrainResult(run_id=None, final_loss=1.0, bpb={"web": 2.0}, tokens=8, train_flops=1.0, wall_seconds=1.0,
                      tokens_per_second=8.0, mfu=0.1, diverged=False, steps=3, config_key=cfg.key())
    (tmp_path / RESULT_FILE).write_text(json.dumps(res.to_json()))
    monkeypatch.delenv("RANK", raising=False)
    assert launch_main(["--config", str(tmp_path / "config.json"), "--run-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out) == res.to_json() and not dist.is_initialized()
    monkeypatch.setenv("RANK", "1")  # torchrun's other ranks return the result quietly
    assert launch_main(["--config", str(tmp_path / "config.json"), "--run-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""


# --- a checkpoint another engine wrote ---

def test_a_run_directory_holding_another_engines_checkpoint_is_refused_not_restarted(tmp_path):
    """The sharded job's checkpoint is not resumed by the one-process job; starting over beside it would
    silently throw away its steps."""
    from rungs.checkpoint import ENGINE_CHECKPOINTS
    from rungs.jaxjob.checkpoint import CHECKPOINT_DIR as JAX
    from rungs.parallel.engine import CHECKPOINT_DIR as SHARDED

    assert {SHARDED, JAX} < set(ENGINE_CHECKPOINTS)  # the names each engine writes, spelled once more there
    (tmp_path / SHARDED).mkdir()
    (tmp_path / SHARDED / "extra.json").write_text("{}")
    (tmp_path / "config.json").write_text('{"written_by": "the sharded job"}')
    with pytest.raises(CheckpointError, match="sharded PyTorch job"):
        train(tiny_config(max_steps=2), run_dir=tmp_path, progress=False)
    assert not (tmp_path / "checkpoint.pt").exists()
    assert (tmp_path / "config.json").read_text() == '{"written_by": "the sharded job"}'  # its config kept


def test_a_fresh_start_removes_every_engines_checkpoint_so_its_resume_is_not_refused(tmp_path):
    """`--fresh` (resume=False) starts over: another engine's checkpoint left beside the new job would
    refuse that job's first resume before a save of its own (a crash in its first steps)."""
    from rungs.jaxjob.checkpoint import CHECKPOINT_DIR as JAX
    from rungs.parallel.engine import CHECKPOINT_DIR as SHARDED

    stale = [SHARDED, JAX, JAX + ".tmp", JAX + ".old"]
    for name in stale:
        (tmp_path / name).mkdir()
        (tmp_path / name / "extra.json").write_text("{}")
    (tmp_path / "checkpoint.pt.tmp").write_bytes(b"torn")
    (tmp_path / "checkpoint_notes.txt").write_text("the user's")  # not a name any engine writes: kept
    (tmp_path / "my_checkpoint").mkdir()
    cfg = tiny_config(max_steps=2)
    train(cfg, run_dir=tmp_path, resume=False, progress=False, stop_after=1)
    assert [name for name in [*stale, "checkpoint.pt.tmp"] if (tmp_path / name).exists()] == []
    assert (tmp_path / "checkpoint.pt").exists()
    assert (tmp_path / "checkpoint_notes.txt").read_text() == "the user's" and (tmp_path / "my_checkpoint").is_dir()
    result = train(cfg, run_dir=tmp_path, progress=False)  # resumes its own step-1 checkpoint
    assert result.steps == 2
