"""Activation gradient clipping: per-token/per-sequence clipping against hand-computed gradients,
the data probe finding a planted corrupt sample, and AGC leaving clean samples' gradients
untouched where global-norm clipping scales them all."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from rungs.agc import ActivationGradClipper, AGCConfigError, AGCSettings
from rungs.model import ModelConfig, Transformer

torch.set_num_threads(1)

V, T, B, CORRUPT_ROW = 64, 32, 8, 5


def _clip_once(settings, upstream):
    clipper = ActivationGradClipper(settings)
    clipper.begin_step(7)
    x = torch.zeros_like(upstream, requires_grad=True)
    (clipper(x, 2, "residual") * upstream).sum().backward()
    return x.grad, clipper


def test_fixed_threshold_clips_only_tokens_above_it_to_exactly_the_threshold():
    g = torch.randn(2, 5, 4)
    g[1, 3] *= 100.0
    thr = 2.0 * float(g[0].norm(dim=-1).max())
    grad, clipper = _clip_once(AGCSettings(mode="fixed", threshold=thr), g)
    expect = g.clone()
    norms = g.norm(dim=-1)
    for b in range(2):
        for t in range(5):
            if norms[b, t] > thr:
                expect[b, t] = g[b, t] * thr / norms[b, t]
    torch.testing.assert_close(grad, expect)
    assert float(grad[1, 3].norm()) == pytest.approx(thr, rel=1e-5)
    assert [(e.step, e.layer, e.point, e.row, e.position) for e in clipper.events] == [(7, 2, "residual", 1, 3)]
    assert clipper.events[0].ratio == pytest.approx(float(norms[1, 3]) / thr, rel=1e-5)


def test_median_mode_threshold_is_a_multiple_of_the_running_median():
    g = torch.ones(1, 9, 4)  # every token norm 2
    g[0, 4] *= 10.0  # one token norm 20
    grad, clipper = _clip_once(AGCSettings(mode="median", threshold=3.0), g)
    assert float(grad[0, 4].norm()) == pytest.approx(6.0)  # 3 × median 2
    torch.testing.assert_close(grad[0, :4], g[0, :4])
    clipper.end_step()
    # The next step uses the history (median 2), not its own batch: a batch of all-large grads is clipped.
    clipper.begin_step(8)
    x = torch.zeros(1, 3, 4, requires_grad=True)
    (clipper(x, 2, "residual") * (10 * torch.ones(1, 3, 4))).sum().backward()
    assert torch.allclose(x.grad.norm(dim=-1), torch.full((1, 3), 6.0))


def test_sequence_granularity_scales_whole_sequences():
    g = torch.randn(3, 6, 4)
    g[2] *= 50.0
    thr = 1.5 * float(g[:2].flatten(1).norm(dim=-1).max())
    grad, clipper = _clip_once(AGCSettings(mode="fixed", threshold=thr, granularity="sequence"), g)
    torch.testing.assert_close(grad[:2], g[:2])
    torch.testing.assert_close(grad[2], g[2] * thr / g[2].norm())
    assert [(e.row, e.position) for e in clipper.events] == [(2, 0)]


def test_bad_settings_raise_typed_errors():
    with pytest.raises(AGCConfigError, match="valid points"):
        AGCSettings(points=("attention_out",))
    with pytest.raises(AGCConfigError, match="positive"):
        AGCSettings(threshold=0.0)


# --- the data probe on a real (tiny) model ----------------------------------------------------

@dataclass
class Origin:
    source: str
    doc_id: int
    token_offset: int


def _locate(row: int, position: int) -> Origin:
    return Origin("planted" if row == CORRUPT_ROW else "counting", 100 + row, 1000 * row + position)


def _counting_batch(gen: torch.Generator) -> torch.Tensor:
    start = torch.randint(0, V, (B, 1), generator=gen)
    return (start + torch.arange(T + 1)) % V  # (B, T+1): trivially predictable text


@pytest.fixture(scope="module")
def trained():
    """A tiny MoE transformer trained until counting sequences are easy for it."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, head_dim=16, n_kv_heads_global=1, n_kv_heads_local=2,
                      global_every=2, window_tokens=8, seq_len=T, n_experts=4, top_k=2, n_shared_experts=1,
                      latent_dim=16, expert_hidden=32, shared_hidden=32, vocab_size=V)
    model = Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        seq = _counting_batch(gen)
        logits, _ = model(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5, f"the tiny model did not learn counting (loss {loss.item():.3f})"
    seq = _counting_batch(gen)
    seq[CORRUPT_ROW] = torch.randint(0, V, (T + 1,), generator=gen)  # the planted corrupt sample
    return model, seq


def _grads(model, seq, clipper=None, rows=None):
    """Parameter gradients of the batch-mean loss, restricted to `rows` (others weigh zero)."""
    model.zero_grad()
    model.activation_clip = clipper if clipper is not None else (lambda x, layer, point: x)
    if clipper is not None:
        clipper.begin_step(0)
        clipper.begin_micro_batch(seq[:, :-1], locate=_locate, decode=lambda ids: " ".join(map(str, ids)))
    logits, _ = model(seq[:, :-1])
    per_token = F.cross_entropy(logits.reshape(-1, V), seq[:, 1:].reshape(-1), reduction="none").view(B, T)
    weight = torch.zeros(B, 1)
    weight[rows if rows is not None else slice(None)] = 1.0
    (per_token * weight).sum().div(B * T).backward()
    model.activation_clip = lambda x, layer, point: x
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_the_probe_finds_the_planted_corrupt_sample(trained):
    model, seq = trained
    clipper = ActivationGradClipper(AGCSettings(mode="median", threshold=8.0, max_logged_events_per_step=1000))
    _grads(model, seq, clipper)
    events = clipper.events
    assert events, "no clip events"
    assert {e.row for e in events} == {CORRUPT_ROW}
    assert {(e.source, e.doc_id) for e in events} == {("planted", 100 + CORRUPT_ROW)}
    worst = max(events, key=lambda e: e.ratio)
    assert worst.token_offset == 1000 * CORRUPT_ROW + worst.position
    assert {e.point for e in events} == {"residual", "moe_input"}
    # The text window is the corrupt row's input tokens (what the model saw: the last one is only a
    # target) around the clipped position.
    ids = seq[CORRUPT_ROW, :-1][max(0, worst.position - 16): worst.position + 17].tolist()
    assert worst.text == " ".join(map(str, ids))


def test_agc_leaves_clean_samples_untouched_where_global_clipping_scales_them(trained):
    model, seq = trained
    clean = [r for r in range(B) if r != CORRUPT_ROW]
    g_clean = _grads(model, seq, rows=clean)
    g_full = _grads(model, seq)
    g_corrupt = _grads(model, seq, rows=[CORRUPT_ROW])
    # One fixed threshold for every call, so the three backward passes clip alike.
    settings = AGCSettings(points=("residual",), mode="fixed", threshold=_fixed_threshold(model, seq))
    g_agc_full = _grads(model, seq, ActivationGradClipper(settings))
    g_agc_corrupt = _grads(model, seq, ActivationGradClipper(settings), rows=[CORRUPT_ROW])
    # AGC: the clean samples' contribution to the batch gradient is exactly their own gradient...
    torch.testing.assert_close(g_agc_full - g_agc_corrupt, g_clean, rtol=1e-4, atol=1e-7)
    # ...and the corrupt sample's contribution shrank, most below the last clip point (the LM head
    # and the last block's own weights sit above it and are not clipped).
    assert g_agc_corrupt.norm() < 0.8 * g_corrupt.norm()
    below = _below_last_clip_point(model)
    assert g_agc_corrupt[below].norm() < 0.2 * g_corrupt[below].norm()
    # Global-norm clipping at the clean batch's norm scales every sample, clean ones included.
    max_norm = float(g_clean.norm())
    scale = min(1.0, max_norm / float(g_full.norm()))
    g_global = g_full * scale
    clean_share = g_global - g_corrupt * scale
    assert scale < 0.7
    torch.testing.assert_close(clean_share, g_clean * scale, rtol=1e-4, atol=1e-7)
    assert (clean_share - g_clean).norm() > 0.3 * g_clean.norm()


def _below_last_clip_point(model) -> torch.Tensor:
    """Mask over the flattened gradient: the embedding and every block but the last."""
    last = len(model.layers) - 1
    return torch.cat([torch.full((p.numel(),), name == "embed.weight" or (name.startswith("layers.")
                                                                         and not name.startswith(f"layers.{last}.")))
                      for name, p in model.named_parameters()])


def _fixed_threshold(model, seq) -> float:
    """2× the largest per-token gradient norm any clean row has at any block's residual input."""
    norms = []

    def record(x, layer, point):
        if point == "residual" and x.requires_grad:
            x.register_hook(lambda g: norms.append(g.norm(dim=-1)))
        return x

    model.zero_grad()
    model.activation_clip = record
    logits, _ = model(seq[:, :-1])
    F.cross_entropy(logits.reshape(-1, V), seq[:, 1:].reshape(-1)).backward()
    model.activation_clip = lambda x, layer, point: x
    clean_max = max(float(torch.cat([n[:CORRUPT_ROW], n[CORRUPT_ROW + 1:]]).max()) for n in norms)
    corrupt_max = max(float(n[CORRUPT_ROW].max()) for n in norms)
    assert corrupt_max > 5 * clean_max, (corrupt_max, clean_max)
    return 2.0 * clean_max
