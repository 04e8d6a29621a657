"""The sharded training step reads the host once, after the optimizer, on 2 real gloo ranks.

`HostSyncCounter` (rungs.host_sync) records every op that would make a GPU step wait for the host,
by op, on the CPU. A step of `ShardedTorchEngine` (FSDP2, the sharded loss, the balancing
statistics' all-reduce, the grad-norm clip over DTensor shards, DistMuon and AdamW) may read the
host only in `rungs.parallel.distributed.train_step`'s final transfer, inside AdamW (its step
counter: a CPU tensor even on a GPU, one read per parameter) and, with activation gradient clipping
on, in AGC's own end-of-step work (its host copy of the tokens, its job-wide exchange and flush).
Under expert parallelism (ep = 2) the same holds with the default capacity (one round, known from
the shapes); with a capacity small enough that the routing decides the number of rounds, each MoE
layer's forward reads that count once per micro-batch (`rungs.parallel.expert_parallel`), and under
a capacity factor (no closed-form count) once per round it runs; nothing else is added.
"""

from __future__ import annotations

import pytest

from tests.rungs.parallel.spawn import run_ranks
from tests.rungs.train_helpers import tiny_config

# AGC's work after the step (`ShardedTorchEngine._end_agc_step`): decoding an event's context from the
# batch's host copy, the job-wide exchange of its statistics (all_gather_object), its one flush.
_AGC_PLACES = ("_record:ids = cur.inputs", "all_gather:dist.all_gather_object", "flush:")


def _step_places(rank: int, world: int, ep: int, overrides: dict, out) -> None:
    from rungs.config import parse_config
    from rungs.parallel.distributed import setup
    from rungs.parallel.engine import ShardedTorchEngine
    from tests.rungs.test_host_sync import _EveryPlace

    engine = ShardedTorchEngine(parse_config(tiny_config(**overrides)), setup(ep=ep))
    engine.build()
    engine.train_step(0, 1.0)  # creates the optimizer state
    counter = _EveryPlace()
    with counter:
        stats = engine.train_step(1, 1.0)
    adamw = engine.optimizer.adamw
    out[rank] = {"places": [where for _, where in counter.places], "stats": stats,
                 "adamw_params": sum(len(g["params"]) for g in adamw.param_groups) if adamw is not None else 0,
                 "layer_calls": len(engine.model.layers) * engine.cfg.accumulation_steps}


def _places(ep: int, overrides: dict) -> list[dict]:
    import torch.multiprocessing as mp

    out = mp.Manager().dict()
    run_ranks(_step_places, 2, ep, overrides, out)
    return [out[0], out[1]]


@pytest.mark.parametrize("ep,overrides", [
    (1, {"agc": False}),
    (1, {"micro_batch_sequences": 2, "grad_clip": 1e-3, "agc": False}),  # 2 micro-batches per rank
    (1, {"agc_mode": "fixed", "agc_threshold": 1e-4, "grad_clip": None}),
    (2, {"agc": False}),
    (2, {"micro_batch_sequences": 2, "grad_clip": 1e-3, "agc": False}),
    (2, {"capacity_per_expert": 2, "micro_batch_sequences": 2, "agc": False}),  # rounds from the routing
    (2, {"capacity_factor": 1.5, "micro_batch_sequences": 2, "agc": False}),    # a read per round
])
def test_the_sharded_step_reads_the_host_once_after_the_optimizer(ep, overrides):
    for rank, got in enumerate(_places(ep, overrides)):
        assert all(isinstance(v, float) for v in got["stats"].values()), got["stats"]
        places = got["places"]
        inside_adamw = [i for i, p in enumerate(places) if p.startswith("step:o.step()")]
        round_counts = [p for p in places if p.startswith("_read:return int(value)")]
        others = [(i, p) for i, p in enumerate(places) if i not in inside_adamw and not p.startswith(_AGC_PLACES)
                  and p not in round_counts]
        if "capacity_factor" in overrides:  # one read per round of each layer call: as many when all are one round
            one_round = got["stats"]["moe_rounds_max"] == 1
            assert len(round_counts) >= got["layer_calls"] and (len(round_counts) == got["layer_calls"]) == one_round
        else:
            assert len(round_counts) == (got["layer_calls"] if "capacity_per_expert" in overrides else 0), round_counts
            assert got["stats"]["moe_rounds_max"] > 1 or "capacity_per_expert" not in overrides, got["stats"]
        # One read in the step itself, its last line; AdamW's reads (one per parameter) come before it.
        assert [p.split(":")[0] for _, p in others] == ["train_step"], (rank, others)
        assert others[0][1].endswith(".tolist()"), others
        assert len(inside_adamw) == got["adamw_params"] > 0, (rank, len(inside_adamw), got["adamw_params"])
        assert max(inside_adamw) < others[0][0], "AdamW's reads belong to optimizer.step(), before the final read"
        agc = [p for p in places if p.startswith(_AGC_PLACES)]
        assert bool(agc) == (overrides.get("agc", True) is not False), agc
