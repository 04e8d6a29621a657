"""Muon optimizer step: against torch.optim.Muon, and as a share of the training step.

Model: the largest cpu-demo rung (`ladder.plan.plan_rung`), built with `rungs.model.Transformer`.
1. Muon alone on that model's Muon parameters (hidden matrices and per-expert stacks) vs
   torch.optim.Muon on the same matrices (each expert stack handed over as E separate 2-D
   parameters, since torch.optim.Muon takes 2-D only), same settings; fixed random gradients.
2. The whole optimizer step (`rungs.optim.build_optimizer`: Muon + AdamW) vs one training step of
   the rung (bf16 autocast forward + backward of one batch of `batch_tokens` tokens, plus that
   optimizer step). Target: optimizer share <= 5%.
3. Our Muon's two bf16 Newton-Schulz paths on the same matrices: emulated (float32 arithmetic rounded
   to bf16 where torch rounds, `ns_emulate=True`) and native bf16 matmuls (`ns_emulate=False`, the
   GPU's path and torch.optim.Muon's). The default (`ns_emulate=None`, "ours" above) is the emulated
   path on CPUs without bf16 units, where the native one is 15-17x slower, and the native path on CPUs
   with AVX512-BF16 or AMX (`rungs.cpu_bf16`), where it is 2.2-2.9x faster than the emulated one
   (`emulated_over_native_muon_step`, reported, not a target; `default_newton_schulz` says which).
Timing: median process CPU seconds on one thread, the compared calls interleaved (robust to other
processes on a shared machine).
"""

from __future__ import annotations

import dataclasses
import sys

import torch
import torch.nn.functional as F

from benchmarks.common import Report, main_for
from benchmarks.moe import interleaved_cpu_seconds, tune_glibc_malloc
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from rungs.cpu_bf16 import cpu_has_bf16_units
from rungs.model import ModelConfig, Transformer
from rungs.muon import Muon
from rungs.optim import MUON_ROLES, build_optimizer, param_role


def largest_demo_rung():
    recipe = load_recipe("cpu-demo")
    spec = plan_rung(recipe, max(recipe.ladder_rungs))
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    arch = {k: v for k, v in dataclasses.asdict(spec.arch).items() if k in fields}
    return spec, ModelConfig(**arch)


def run(quick: bool) -> Report:
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    repeats = 5 if quick else 11
    spec, cfg = largest_demo_rung()
    model = Transformer(cfg)
    results: dict = {"rung": spec.arch.n_layers, "d_model": cfg.d_model, "params_total": spec.params_total,
                     "batch_tokens": spec.batch_tokens, "torch_threads": 1,
                     "timing": "median process CPU seconds, interleaved"}

    # 1. our Muon vs torch.optim.Muon on the same matrices ------------------------------------
    muon_params = [p for n, p in model.named_parameters() if param_role(n, p) in MUON_ROLES]
    ours = [torch.nn.Parameter(p.detach().clone()) for p in muon_params]
    theirs = [torch.nn.Parameter(m.detach().clone()) for p in muon_params for m in (p if p.ndim == 3 else [p])]
    for p in ours:
        p.grad = torch.randn_like(p)
    grads_2d = [m for p in ours for m in (p.grad if p.ndim == 3 else [p.grad])]
    for p, g in zip(theirs, grads_2d):
        p.grad = g.clone()
    native, emulated = ([torch.nn.Parameter(p.detach().clone()) for p in muon_params] for _ in range(2))
    for p, e, q in zip(native, emulated, ours):
        p.grad, e.grad = q.grad.clone(), q.grad.clone()
    opt_ours = Muon(ours, lr=1e-3, weight_decay=0.1)
    opt_native = Muon(native, lr=1e-3, weight_decay=0.1, ns_emulate=False)
    opt_emulated = Muon(emulated, lr=1e-3, weight_decay=0.1, ns_emulate=True)
    opt_torch = torch.optim.Muon(theirs, lr=1e-3, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    seconds = interleaved_cpu_seconds({"ours": opt_ours.step, "native": opt_native.step,
                                       "emulated": opt_emulated.step, "torch": opt_torch.step}, repeats)
    results["muon_step_seconds"] = seconds["ours"]
    results["default_newton_schulz"] = "native" if cpu_has_bf16_units() else "emulated"
    results["native_bf16_muon_step_seconds"] = seconds["native"]
    results["emulated_bf16_muon_step_seconds"] = seconds["emulated"]
    results["emulated_over_native_muon_step"] = seconds["emulated"] / seconds["native"]
    results["torch_muon_step_seconds"] = seconds["torch"]
    results["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    results["muon_matrices"] = len(theirs)
    results["muon_parameters"] = len(ours)

    # 2. optimizer step share of the training step ----------------------------------------------
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.1)
    results["convention"] = optimizer.convention
    n_seq = spec.batch_tokens // cfg.seq_len
    tokens = torch.randint(0, cfg.vocab_size, (n_seq, cfg.seq_len + 1))

    def forward_backward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = model(tokens[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()

    forward_backward()                                  # grads exist for every parameter from here on
    tune_glibc_malloc()                                 # as a CPU training process would
    parts = interleaved_cpu_seconds({"forward_backward": forward_backward, "optimizer_step": optimizer.step},
                                    repeats)
    results.update({f"{k}_seconds": v for k, v in parts.items()})
    share = parts["optimizer_step"] / (parts["optimizer_step"] + parts["forward_backward"])
    results["optimizer_share_of_train_step"] = share
    torch.set_num_threads(threads)

    report = Report("muon", results)
    report.check("muon_optimizer_share_of_train_step", share, "<=", 0.05)
    report.check("muon_step_over_torch_optim_muon", seconds["ours"] / seconds["torch"], "<=", 1.0)
    return report


if __name__ == "__main__":
    sys.exit(main_for("muon", run))
