"""What a compiled XLA program allocates, read from its HLO text: the largest array shapes and the ops
that make them. Shared by the JAX benchmarks (`jax_memory`'s programs, `jax_gpu_rung`'s expert
candidates); a helper, not a benchmark."""

from __future__ import annotations

import re
from typing import Any

_DTYPE_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s16": 2,
                "u16": 2, "s8": 1, "u8": 1, "pred": 1}
_ARRAY = re.compile(r"=\s*(\w+)\[([\d,]*)\]\{[^}]*\}\s+([\w-]+)\(")


def largest_buffers(hlo_text: str, count: int = 3) -> list[dict[str, Any]]:
    """The `count` largest distinct array shapes a compiled program's HLO makes, with the op."""
    seen: dict[str, dict[str, Any]] = {}
    for dtype, dims, op in _ARRAY.findall(hlo_text):
        if dtype not in _DTYPE_BYTES:
            continue
        size = _DTYPE_BYTES[dtype]
        for d in filter(None, dims.split(",")):
            size *= int(d)
        shape = f"{dtype}[{dims}]"
        if shape not in seen or op not in seen[shape]["ops"]:
            entry = seen.setdefault(shape, {"shape": shape, "bytes": size, "ops": []})
            entry["ops"].append(op)
    return sorted(seen.values(), key=lambda e: -e["bytes"])[:count]
