"""JAX activation gradient clipping against rungs.agc: on a small two-layer function with a planted
outlier token, the custom_vjp clips the same units at the same points with the same gradients
(within 1e-6) over several steps of micro-batches, the events and their JSON records are the same,
and the median is torch's lower median."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from rungs.agc import ActivationGradClipper, write_events
from rungs.agc_settings import AGCSettings
from rungs.jaxjob.agc import AGC, ClipRecorder

torch.set_num_threads(1)

N_LAYERS, B, T, D = 2, 4, 6, 8
OUTLIER = (1, 3)  # (row, position) of the planted token in every batch


def _weights():
    rng = np.random.default_rng(0)
    return [tuple((rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for _ in range(2))
            for _ in range(N_LAYERS)]


def _forward(x, clip, weights, lib):
    """The block structure of rungs.model: clip the residual entering the block, a mixing branch,
    clip the normed MoE input, a second branch."""
    for layer, (w1, w2) in enumerate(weights):
        x = clip(x, layer, "residual")
        x = x + lib.tanh(x @ w1)
        h = clip(x / lib.sqrt((x * x).mean(-1, keepdims=True) + 1e-6), layer, "moe_input")
        x = x + h @ w2
    return x


def _batches(steps, micro):
    rng = np.random.default_rng(1)
    out = []
    for _ in range(steps):
        step = []
        for _ in range(micro):
            x = rng.standard_normal((B, T, D)).astype(np.float32)
            up = rng.standard_normal((B, T, D)).astype(np.float32)
            up[OUTLIER] *= 40.0                         # the corrupt token: a huge upstream gradient
            ids = rng.integers(0, 100, (B, T))
            step.append((x, up, ids))
        out.append(step)
    return out


def _locate(row, position):
    return SimpleNamespace(source=f"src{row % 2}", doc_id=row * 10, token_offset=position + 100)


def _decode(ids):
    return " ".join(str(i) for i in ids)


def _torch_run(settings, batches):
    weights = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in _weights()]
    clipper = ActivationGradClipper(settings)
    grads, rates = [], []
    for step, micro in enumerate(batches):
        clipper.begin_step(step)
        for x, up, ids in micro:
            clipper.begin_micro_batch(torch.from_numpy(ids), locate=_locate, decode=_decode)
            xt = torch.from_numpy(x).requires_grad_()
            (_forward(xt, clipper, weights, torch) * torch.from_numpy(up)).sum().backward()
            grads.append(xt.grad.numpy())
        rates.append(clipper.end_step())
    return grads, rates, clipper.drain_events(), clipper.state_dict()


def _jax_run(settings, batches):
    weights = [(jnp.asarray(a), jnp.asarray(b)) for a, b in _weights()]
    agc = AGC(settings)
    recorder = ClipRecorder(settings)

    @jax.jit
    def grad_fn(x, probes, thresholds, up):
        def loss(x, probes):
            return (_forward(x, agc.bind(probes, thresholds), weights, jnp) * up).sum()
        return jax.grad(loss, argnums=(0, 1))(x, probes)

    grads, rates = [], []
    for step, micro in enumerate(batches):
        recorder.begin_step(step)
        thresholds = recorder.thresholds(N_LAYERS)
        for x, up, ids in micro:
            gx, readout = grad_fn(jnp.asarray(x), agc.probes(N_LAYERS, B, T), thresholds, jnp.asarray(up))
            recorder.record(readout, inputs=ids, locate=_locate, decode=_decode)
            grads.append(np.asarray(gx))
        rates.append(recorder.end_step())
    assert grad_fn._cache_size() == 1                 # new thresholds every step, one compilation
    return grads, rates, recorder.drain_events(), recorder.state_dict()


SETTINGS = {
    "token-median": AGCSettings(mode="median", threshold=3.0, median_window_steps=2, max_logged_events_per_step=3,
                                context_tokens=2),
    "token-fixed": AGCSettings(mode="fixed", threshold=4.0, max_logged_events_per_step=50),
    "sequence-median": AGCSettings(granularity="sequence", mode="median", threshold=1.5, median_window_steps=3),
    "moe-input-only": AGCSettings(points=("moe_input",), mode="median", threshold=2.0),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_jax_clipping_and_events_equal_rungs_agc(name, tmp_path):
    settings = SETTINGS[name]
    batches = _batches(steps=4, micro=2)
    t_grads, t_rates, t_events, t_state = _torch_run(settings, batches)
    j_grads, j_rates, j_events, j_state = _jax_run(settings, batches)
    for tg, jg in zip(t_grads, j_grads):  # within 1e-6 of the gradient's scale (float32 rounding of the
        np.testing.assert_allclose(jg, tg, rtol=1e-6, atol=1e-6 * np.abs(tg).max())  # two frameworks)
    assert j_rates == pytest.approx(t_rates, abs=0)
    assert any(r > 0 for r in t_rates)                            # the test exercises clipping
    key = ("step", "layer", "point", "row", "position", "source", "doc_id", "token_offset", "text")
    def fields(events):
        return [tuple(getattr(e, k) for k in key) for e in events]

    assert fields(j_events) == fields(t_events)
    if name.startswith("token"):
        assert any((e.row, e.position) == OUTLIER for e in t_events)
    for te, je in zip(t_events, j_events):
        assert je.norm == pytest.approx(te.norm, rel=1e-6)
        assert je.threshold == pytest.approx(te.threshold, rel=1e-6)
    assert j_state["total_clips"] == t_state["total_clips"]
    assert set(j_state["history"]) == set(t_state["history"])
    for k in t_state["history"]:
        assert j_state["history"][k] == pytest.approx(t_state["history"][k], rel=1e-6)
    # The JSON records (clip_events.jsonl) carry the same fields.
    write_events(t_events, tmp_path / "torch.jsonl")
    write_events(j_events, tmp_path / "jax.jsonl")
    t_lines = [json.loads(s) for s in (tmp_path / "torch.jsonl").read_text().splitlines()]
    j_lines = [json.loads(s) for s in (tmp_path / "jax.jsonl").read_text().splitlines()]
    assert [sorted(r) for r in j_lines] == [sorted(r) for r in t_lines] and t_lines


def test_median_is_the_lower_median_as_torch():
    """Token norms 1, 2, 10, 100: the lower median is 2 (threshold 4 x 2 = 8 clips the 10); the
    mean-of-middle median 6 (threshold 24) would not."""
    settings = AGCSettings(mode="median", threshold=4.0)
    up = np.zeros((1, 4, D), np.float32)
    for t, norm in enumerate([1.0, 2.0, 10.0, 100.0]):
        up[0, t, 0] = norm
    agc, recorder = AGC(settings), ClipRecorder(settings)

    def loss(x, probes):
        return (agc.bind(probes, jnp.asarray(recorder.thresholds(1)))(x, 0, "residual") * up).sum()

    gx, readout = jax.grad(loss, argnums=(0, 1))(jnp.zeros((1, 4, D)), agc.probes(1, 1, 4))
    recorder.begin_step(0)
    recorder.record(readout)
    assert float(readout.stats[0, 0, 0]) == 2.0 and float(readout.stats[0, 0, 1]) == 8.0
    np.testing.assert_allclose(np.linalg.norm(np.asarray(gx)[0], axis=-1), [1.0, 2.0, 8.0, 8.0], rtol=1e-6)
    assert [e.position for e in recorder.events] == [3, 2]

    clipper = ActivationGradClipper(settings)
    clipper.begin_step(0)
    x = torch.zeros(1, 4, D, requires_grad=True)
    (clipper(x, 0, "residual") * torch.from_numpy(up)).sum().backward()
    np.testing.assert_allclose(np.asarray(gx), x.grad.numpy(), rtol=1e-6)
    assert [e.position for e in clipper.events] == [3, 2]


def test_recorder_state_dict_round_trips_with_rungs_agc():
    """A history written by either engine loads into the other (same keys, same thresholds)."""
    settings = AGCSettings(mode="median", threshold=3.0, median_window_steps=2)
    clipper = ActivationGradClipper(settings)
    clipper.load_state_dict({"history": {"0:residual": [1.0, 3.0], "1:moe_input": [2.0]}, "total_clips": 5})
    recorder = ClipRecorder(settings)
    recorder.load_state_dict(clipper.state_dict())
    assert recorder.state_dict() == clipper.state_dict()
    thresholds = recorder.thresholds(2)
    assert thresholds[0, 0] == np.float32(clipper.threshold(0, "residual", 99.0)) == 6.0   # median of 1, 3: 2
    assert thresholds[1, 1] == np.float32(clipper.threshold(1, "moe_input", 99.0))
    assert np.isnan(thresholds[0, 1]) and np.isnan(thresholds[1, 0])                      # no history yet


@pytest.mark.parametrize("activation_checkpointing", ["none", "selective", "full"])
def test_the_jax_model_with_agc_clips_where_the_torch_model_does(activation_checkpointing):
    """The rung model itself (rungs.jaxjob.model loaded from a torch state dict): the same units clip
    at the same (layer, point, row, position), and the weight gradients agree; with each activation
    checkpointing mode on both sides (the backward recomputes what the clip points see)."""
    import torch.nn.functional as F

    from rungs.jaxjob import model as jax_model
    from rungs.jaxjob.params import from_torch_state_dict
    from rungs.model import ModelConfig, Transformer

    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, head_dim=16, n_kv_heads_global=1, n_kv_heads_local=2,
                      global_every=2, window_tokens=8, seq_len=16, n_experts=4, top_k=2, n_shared_experts=1,
                      latent_dim=16, expert_hidden=32, shared_hidden=32, vocab_size=64,
                      activation_checkpointing=activation_checkpointing)
    model = Transformer(cfg)
    seq = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(1))
    settings = AGCSettings(mode="median", threshold=1.5, max_logged_events_per_step=1000)

    clipper = ActivationGradClipper(settings)
    model.activation_clip = clipper
    clipper.begin_step(0)
    clipper.begin_micro_batch(seq[:, :-1])
    logits, _ = model(seq[:, :-1])
    F.cross_entropy(logits.reshape(-1, 64), seq[:, 1:].reshape(-1)).backward()

    params, buffers = from_torch_state_dict(model.state_dict(), cfg)
    agc, recorder = AGC(settings), ClipRecorder(settings)
    recorder.begin_step(0)
    thresholds = jnp.asarray(recorder.thresholds(cfg.n_layers))

    def loss(params, probes):
        return jax_model.loss(params, buffers, jnp.asarray(seq[:, :-1].numpy()), jnp.asarray(seq[:, 1:].numpy()),
                              cfg, clip=agc.bind(probes, thresholds))[0]

    grads, readout = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, agc.probes(cfg.n_layers, 4, 16))
    recorder.record(readout)
    key = [(e.layer, e.point, e.row, e.position) for e in clipper.events]
    assert len(key) >= 5 and [(e.layer, e.point, e.row, e.position) for e in recorder.events] == key
    assert recorder.clipped_units == clipper.clipped_units
    for name, p in model.named_parameters():
        want = p.grad.numpy()
        np.testing.assert_allclose(np.asarray(grads[name]), want, rtol=1e-4, atol=1e-5 * np.abs(want).max(),
                                   err_msg=name)
