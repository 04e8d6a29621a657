"""JAX vs PyTorch forward+backward time of one cpu-demo transformer block, on one thread.

Usage: taskset -c 0 .venv/bin/python scripts/jax_block_time.py [--rung 6] [--repeats 15] [--layers 0 2] [--model]

Both engines get the same weights (the torch block's, converted) and the same input (B =
batch_sequences of the rung, T = seq_len); the work timed is the block's forward and the gradient
of sum(out * upstream) with respect to the input and every parameter. Steps alternate between the
engines so load drifts hit both alike, and the time is the process's CPU time (both engines run
on one thread), which other jobs on a shared machine disturb far less than wall time; the medians
are reported, with their ratio. Layer 0 is a
windowed (local) layer of the cpu-demo pattern, layer 2 a global one. Attention and MoE halves are
timed apart too, since the first prototype was slow in attention only.

A measurement, not a test: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# One thread for XLA:CPU: Eigen's pool off (set before jax is imported), and the client's executor
# pool sized by the one CPU the process may use while it starts (see benchmarks/jax_step.py).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
_ALLOWED = os.sched_getaffinity(0)
os.sched_setaffinity(0, {min(_ALLOWED)})

import jax  # noqa: E402

jax.devices()
os.sched_setaffinity(0, _ALLOWED)
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
from dataclasses import asdict  # noqa: E402

from ladder.plan.generator import plan_rung  # noqa: E402
from ladder.plan.recipe import load_recipe  # noqa: E402
from rungs.jaxjob import model as M  # noqa: E402
from rungs.model import Block, ModelConfig, Transformer  # noqa: E402


def _median_pair(torch_step, jax_step, repeats: int) -> tuple[float, float]:
    torch_step(), jax_step()  # warm (jit compile, allocator)
    t_times, j_times = [], []
    for _ in range(repeats):
        t0 = time.process_time()
        torch_step()
        t1 = time.process_time()
        jax_step()
        t2 = time.process_time()
        t_times.append(t1 - t0)
        j_times.append(t2 - t1)
    return statistics.median(t_times), statistics.median(j_times)


def measure(rung: int, layer: int, repeats: int) -> dict[str, tuple[float, float]]:
    spec = plan_rung(load_recipe("cpu-demo"), rung)
    cfg = ModelConfig(**asdict(spec.arch))
    B, T, d = spec.to_dict()["batch_sequences"], cfg.seq_len, cfg.d_model
    torch.manual_seed(0)
    model = Transformer(cfg)
    blk: Block = model.layers[layer]
    x = torch.randn(B, T, d)
    upstream = torch.randn(B, T, d)
    params = {f"layers.{layer}.{n}": jnp.asarray(p.detach().numpy()) for n, p in blk.named_parameters()}
    cos, sin = (jnp.asarray(t) for t in M.rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta))
    jx, jup = jnp.asarray(x.numpy()), jnp.asarray(upstream.numpy())
    pre = f"layers.{layer}."

    def torch_part(fn):
        def step():
            xs = x.clone().requires_grad_()
            blk.zero_grad(set_to_none=True)
            (fn(xs) * upstream).sum().backward()
        return step

    def jax_part(fn):
        grad = jax.jit(jax.grad(lambda p, x: (fn(p, x) * jup).sum(), argnums=(0, 1)))
        return lambda: jax.block_until_ready(grad(params, jx))

    parts = {
        "block": (lambda xs: blk(xs, model.rope_cos, model.rope_sin, lambda a, i, q: a)[0],
                  lambda p, x: M.block(p, layer, x, cos, sin, None, cfg)[0]),
        "attention": (lambda xs: blk.attn(blk.attn_norm(xs), model.rope_cos, model.rope_sin),
                      lambda p, x: M.attention(p, pre + "attn.", M.rms_norm(x, p[pre + "attn_norm.weight"]),
                                               cos, sin, cfg, cfg.is_global_layer(layer))),
        "moe": (lambda xs: blk.moe(blk.moe_norm(xs))[0],
                lambda p, x: M.latent_moe(p, pre + "moe.", None, M.rms_norm(x, p[pre + "moe_norm.weight"]), cfg)[0]),
    }
    return {name: _median_pair(torch_part(t), jax_part(j), repeats) for name, (t, j) in parts.items()}


def measure_model(rung: int, repeats: int) -> tuple[float, float]:
    """The whole model's loss (CE + 0.01 LBL, the default objective) and every gradient."""
    import torch.nn.functional as F

    from rungs.jaxjob import params as P
    from rungs.router import load_balancing_loss

    spec = plan_rung(load_recipe("cpu-demo"), rung)
    cfg = ModelConfig(**asdict(spec.arch))
    B = spec.to_dict()["batch_sequences"]
    torch.manual_seed(0)
    model = Transformer(cfg)
    inputs, targets = (torch.randint(0, cfg.vocab_size, (B, cfg.seq_len)) for _ in range(2))

    def torch_step():
        model.zero_grad(set_to_none=True)
        logits, routes = model(inputs)
        ce = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        (ce + 0.01 * load_balancing_loss(routes, cfg.n_experts, cfg.top_k)).backward()

    params, buffers = P.from_torch_state_dict(model.state_dict(), cfg)
    grad = jax.jit(jax.grad(lambda p, b, x, y: M.loss(p, b, x, y, cfg, 0.01)[0]))
    ji, jt = jnp.asarray(inputs.numpy()), jnp.asarray(targets.numpy())
    return _median_pair(torch_step, lambda: jax.block_until_ready(grad(params, buffers, ji, jt)), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rung", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--model", action="store_true", help="also time the whole model's loss and gradients")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"cpu-demo L{args.rung}, one thread, jax {jax.__version__} ({jax.default_backend()}), "
          f"torch {torch.__version__}; medians of {args.repeats} interleaved steps")
    print(f"{'layer':>5} {'part':>10} {'torch ms':>9} {'jax ms':>9} {'jax/torch':>9}")
    for layer in args.layers:
        for name, (t, j) in measure(args.rung, layer, args.repeats).items():
            print(f"{layer:>5} {name:>10} {t * 1e3:9.2f} {j * 1e3:9.2f} {j / t:9.2f}")
    if args.model:
        t, j = measure_model(args.rung, args.repeats)
        print(f"{'all':>5} {'model':>10} {t * 1e3:9.2f} {j * 1e3:9.2f} {j / t:9.2f}")


if __name__ == "__main__":
    main()
