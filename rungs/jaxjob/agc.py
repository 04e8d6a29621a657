"""Activation gradient clipping for the JAX engine: `rungs.agc`'s clip rule as a `jax.custom_vjp`,
and its clip-event data probe as arrays that the host turns into the same `ClipEvent` records.

Device side. `clip_activation_grad(x, probe, threshold, rule)` is the identity forward; backward
it measures each token's (or sequence's) gradient L2 norm in float32, takes the LOWER median of
those norms (as torch's `Tensor.median` does), picks the threshold (the `threshold` input, or
rule.threshold × that median where the input is NaN: median mode before any history, as
`rungs.agc` lets the current batch stand in), and rescales the units above it down to it. A
backward pass can only return cotangents, so the measurements leave through the cotangent of
`probe`: differentiate the loss with respect to the probes too and their "gradient" is the
readout (per-unit norms, and the median and threshold used). `AGC` stacks one probe per
(layer, point) so a model needs a single extra argument.

Host side. `ClipRecorder` is `rungs.agc.ActivationGradClipper`'s bookkeeping over those arrays:
the running history of per-step medians (statistics.median over the steps, as there), the
per-step logging budget spent in the order torch's backward reaches the points (last layer
first; within a layer `moe_input` before `residual`), worst offenders first, `locate`/`decode`
for source, document, offset and text, clip rates, `synchronise`, and the same state_dict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rungs.agc import ClipEvent, Decode, Locate, write_events
from rungs.agc_history import ClipHistory
from rungs.agc_settings import POINTS, AGCSettings

__all__ = ["AGC", "ClipEvent", "ClipRecorder", "ClipRule", "Probe", "clip_activation_grad", "write_events"]


@dataclass(frozen=True)
class ClipRule:
    """What the backward pass needs of AGCSettings (static: hashable, part of the trace)."""

    granularity: str = "token"
    threshold: float = 8.0


class Probe(NamedTuple):
    """Zeros going in; as a cotangent: norms (..., B, U) per unit (U = T per token, 1 per
    sequence) and stats (..., 2) = (lower median of the norms, threshold applied)."""

    norms: jax.Array
    stats: jax.Array


def _lower_median(values: jax.Array) -> jax.Array:
    flat = jnp.sort(values.reshape(-1))
    return flat[(flat.shape[0] - 1) // 2]


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def clip_activation_grad(x: jax.Array, probe: Probe, threshold: jax.Array, rule: ClipRule) -> jax.Array:
    """Identity on x (B, T, d); clips x's gradient (see the module docstring)."""
    del probe, threshold, rule
    return x


def _clip_fwd(x, probe, threshold, rule):
    del probe, rule
    return x, threshold


def _clip_bwd(rule, threshold, grad):
    g = grad.astype(jnp.float32)
    if rule.granularity == "token":
        norms = jnp.sqrt(jnp.sum(g * g, axis=-1))                                   # (B, T)
    else:
        norms = jnp.sqrt(jnp.sum(g * g, axis=(-2, -1)))[:, None]                    # (B, 1)
    current = _lower_median(norms)
    thr = jnp.where(jnp.isnan(threshold), rule.threshold * jnp.maximum(current, 1e-30), threshold)
    thr = thr.astype(jnp.float32)
    scale = jnp.where(norms > thr, thr / norms, 1.0)
    clipped = (g * scale[..., None]).astype(grad.dtype)
    return clipped, Probe(norms, jnp.stack([current, thr])), jnp.zeros_like(threshold)


clip_activation_grad.defvjp(_clip_fwd, _clip_bwd)


@dataclass(frozen=True)
class AGC:
    """The clip points of one model: probes stacked (n_layers, len(points), ...), `points` in
    `rungs.agc.POINTS` order. `bind(probes, thresholds)` gives the `(x, layer, point) -> x`
    callable a model calls where rungs.model calls `activation_clip`."""

    settings: AGCSettings

    @property
    def points(self) -> tuple[str, ...]:
        return tuple(p for p in POINTS if p in self.settings.points)

    @property
    def rule(self) -> ClipRule:
        return ClipRule(self.settings.granularity, float(self.settings.threshold))

    def probes(self, n_layers: int, batch: int, seq_len: int) -> Probe:
        units = seq_len if self.settings.granularity == "token" else 1
        shape = (n_layers, len(self.points))
        return Probe(jnp.zeros((*shape, batch, units), jnp.float32), jnp.zeros((*shape, 2), jnp.float32))

    def bind(self, probes: Probe, thresholds: jax.Array) -> Callable[[jax.Array, int, str], jax.Array]:
        rule, points = self.rule, self.points

        def clip(x: jax.Array, layer: int, point: str) -> jax.Array:
            if point not in points:
                return x
            i = points.index(point)
            return clip_activation_grad(x, Probe(probes.norms[layer, i], probes.stats[layer, i]),
                                        thresholds[layer, i], rule)

        return clip


@dataclass
class _MicroBatch:
    inputs: Any = None
    locate: Locate | None = None
    decode: Decode | None = None


@dataclass
class ClipRecorder(ClipHistory):
    """Host bookkeeping of one job (see the module docstring). Per step: `begin_step(step)`,
    `thresholds(n_layers)` into the jitted step, `record(readout, ...)` for each micro-batch's
    probe cotangents, `end_step()` for the clip rate, `drain_events()` for the log."""

    _step: int = 0

    @property
    def points(self) -> tuple[str, ...]:
        return AGC(self.settings).points

    def begin_step(self, step: int) -> None:
        self._step = step
        self._reset_step()

    def thresholds(self, n_layers: int) -> np.ndarray:
        """(n_layers, len(points)) float32: this step's thresholds, NaN where the batch's median decides."""
        out = np.full((n_layers, len(self.points)), np.nan, np.float32)
        for layer in range(n_layers):
            for i, point in enumerate(self.points):
                thr = self.history_threshold(layer, point)
                if thr is not None:
                    out[layer, i] = thr
        return out

    def record(self, readout: Probe, inputs: Any = None, locate: Locate | None = None,
               decode: Decode | None = None) -> None:
        """Fold one micro-batch's probe cotangents in: statistics, then events in backward order."""
        norms_all, stats_all = np.asarray(readout.norms), np.asarray(readout.stats)
        cur = _MicroBatch(None if inputs is None else np.asarray(inputs), locate, decode)
        for layer in reversed(range(norms_all.shape[0])):
            for i in reversed(range(len(self.points))):
                self._record_point(layer, self.points[i], norms_all[layer, i], stats_all[layer, i], cur)

    def _record_point(self, layer: int, point: str, norms: np.ndarray, stats: np.ndarray, cur: _MicroBatch) -> None:
        current, thr_applied = float(stats[0]), np.float32(stats[1])
        self._step_medians.setdefault((layer, point), []).append(current)
        thr = self.history_threshold(layer, point)
        thr = self.settings.threshold * max(current, 1e-30) if thr is None else thr
        over = norms > thr_applied                              # the device's decision, bit for bit
        self.total_units += norms.size
        n_over = int(over.sum())
        if n_over == 0:
            return
        self.clipped_units += n_over
        self.total_clips += n_over
        budget = self.settings.max_logged_events_per_step - self._logged_this_step
        if budget <= 0:
            return
        idx = [tuple(int(v) for v in rc) for rc in np.argwhere(over)]
        idx.sort(key=lambda rc: -float(norms[rc]))              # worst first; stable, as rungs.agc
        for row, col in idx[:budget]:
            position = col if self.settings.granularity == "token" else 0
            ev = ClipEvent(step=self._step, layer=layer, point=point, row=row, position=position,
                           norm=float(norms[row, col]), threshold=thr)
            if cur.locate is not None:
                origin = cur.locate(row, position)
                ev.source, ev.doc_id, ev.token_offset = origin.source, origin.doc_id, origin.token_offset
            if cur.inputs is not None and cur.decode is not None:
                c = self.settings.context_tokens
                ev.text = cur.decode(cur.inputs[row, max(0, position - c): position + c + 1].tolist())
            self.events.append(ev)
            self._logged_this_step += 1
