"""Expert-parallel multi-round MoE: time and per-rank peak memory, balanced vs worst routing, and the
fraction of steps that need one round once the capacity is calibrated.

W gloo processes (2 quick, 4 full), `rungs.parallel.expert_parallel.ExpertParallelExperts` with 4 experts
per rank, top-2, each rank routing its own tokens.
- balanced: every expert gets exactly T·k·W/E pairs; worst: every pair of every rank goes to the
  two experts of rank 0. Capacity = the balanced load, so balanced needs one round and worst
  needs T·k·W / (4·capacity) = W rounds. Forward + backward, median wall seconds; peak bytes of
  tensors live at once (`peak_allocated_bytes`: torch's MemTracker on CPU, CUDA's counter on GPU).
- calibration: a router (random weights, inputs with a shared mean so routing is skewed and
  varies step to step) gives each step's global per-expert counts; `rungs.moe.calibrate_capacity`
  picks the capacity at the 99.5% quantile of the calibration steps; held-out steps then run the
  expert-parallel layer and count how many needed one round (target >= 99%, the report's).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from benchmarks.common import Report, main_for
from benchmarks.dist_muon import spawn_workers, timed

EXPERTS_PER_RANK, TOP_K = 4, 2


def _routing(kind: str, rank: int, tokens: int, n_experts: int) -> torch.Tensor:
    if kind == "balanced":
        pairs = torch.arange(tokens * TOP_K) + rank * tokens * TOP_K
        return (pairs % n_experts).view(tokens, TOP_K)
    return torch.tensor([[0, 1]]).expand(tokens, TOP_K).contiguous()


def _worker(rank: int, world: int, quick: bool) -> dict:
    from rungs.parallel.expert_parallel import ExpertParallelExperts, peak_allocated_bytes
    from rungs.moe import RoutedExperts, calibrate_capacity
    from rungs.router import Router

    latent, hidden, tokens = (64, 128, 256) if quick else (128, 256, 1024)
    n_experts = EXPERTS_PER_RANK * world
    torch.manual_seed(0)
    full = RoutedExperts(n_experts, latent, hidden)
    capacity = tokens * TOP_K * world // n_experts
    out: dict = {"world": world, "experts": n_experts, "top_k": TOP_K, "latent_dim": latent, "hidden": hidden,
                 "tokens_per_rank": tokens, "capacity_per_expert": capacity}
    x = torch.randn(tokens, latent, generator=torch.Generator().manual_seed(rank)).requires_grad_(True)
    gate = torch.rand(tokens, TOP_K)
    for kind in ("balanced", "worst"):
        ep = ExpertParallelExperts(full, dist.group.WORLD, capacity_per_expert=capacity, group_size=EXPERTS_PER_RANK)
        idx = _routing(kind, rank, tokens, n_experts)

        def step():
            ep(x, idx, gate).sum().backward()

        out[f"{kind}_seconds"] = timed(step, 3 if quick else 7)
        _, peak = peak_allocated_bytes(step)
        out[f"{kind}_peak_bytes"] = peak
        out[f"{kind}_rounds"] = ep.last_stats["rounds"]

    # capacity calibration on skewed, step-to-step varying routing
    router = Router(latent, n_experts, TOP_K)
    shift = torch.randn(latent, generator=torch.Generator().manual_seed(99)) * 0.5

    def route(step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        return router(torch.randn(tokens, latent, generator=gen) + shift).expert_idx

    calib_steps, held_steps = (400, 200) if quick else (1000, 500)
    samples = []
    with torch.no_grad():
        for s in range(calib_steps):
            counts = torch.bincount(route(s).reshape(-1), minlength=n_experts)
            dist.all_reduce(counts)
            samples.append(counts)
        calibrated = calibrate_capacity(torch.stack(samples), EXPERTS_PER_RANK, quantile=0.995)
        ep = ExpertParallelExperts(full, dist.group.WORLD, capacity_per_expert=calibrated,
                                   group_size=EXPERTS_PER_RANK)
        one_round = 0
        for s in range(calib_steps, calib_steps + held_steps):
            ep(x.detach(), route(s), gate)
            one_round += ep.last_stats["rounds"] == 1
    out |= {"calibrated_capacity": calibrated, "balanced_capacity": capacity,
            "one_round_fraction": one_round / held_steps, "held_out_steps": held_steps}
    return out


def run(quick: bool) -> Report:
    world = 2 if quick else 4
    ranks = spawn_workers(_worker, world, quick)
    r = {k: v for k, v in ranks[0].items() if not k.endswith(("_peak_bytes", "_seconds"))}
    for kind in ("balanced", "worst"):
        r[f"{kind}_peak_bytes_per_rank"] = [x[f"{kind}_peak_bytes"] for x in ranks]
        r[f"{kind}_seconds"] = max(x[f"{kind}_seconds"] for x in ranks)
    skew = max(w / b for w, b in zip(r["worst_peak_bytes_per_rank"], r["balanced_peak_bytes_per_rank"]))
    r["peak_memory_worst_over_balanced"] = skew
    r["time_worst_over_balanced"] = r["worst_seconds"] / r["balanced_seconds"]
    report = Report("dist_moe", results=r)
    report.check("moe_peak_memory_skew_over_balanced", skew, "<=", 1.1)
    report.check("one_round_fraction_after_calibration", r["one_round_fraction"], ">=", 0.99)
    return report


if __name__ == "__main__":
    sys.exit(main_for("dist_moe", run))
