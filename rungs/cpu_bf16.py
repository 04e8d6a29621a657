"""Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX tiles). On other CPUs (AVX2)
torch's bf16 GEMMs run 15-17x slower than float32, so Muon's bf16 Newton-Schulz is computed in float32
there and rounded where torch rounds (`rungs.muon.newton_schulz`); on CPUs with bf16 units the native
bf16 path is 2.2-2.9x faster than that emulation (`python -m benchmarks.muon --quick`).
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def cpu_has_bf16_units() -> bool:
    """AVX512-BF16 or AMX on this CPU, as torch's own dispatch sees it (False if torch no longer says)."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)
