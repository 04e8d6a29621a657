"""How many tokens one chunk of the chunked LM-head loss (`rungs.loss`) takes: torch-free, so the
memory planner can count the same chunk the job runs.

A chunk holds its (tokens × vocab) logits and their gradient at once, at most `BYTES_PER_LOGIT`
bytes per logit (fp32 logits and log-probabilities, then the log-probabilities and the bf16
gradient). What sets its size:

- the weight gradient is one GEMM per chunk contracting over the chunk's tokens, accumulated into
  the fp32 (vocab × d) gradient inside the GEMM: its (vocab × d) read and write are fixed per chunk,
  so the GEMM's share of useful work grows with the chunk (at 256 tokens it contracted too little
  to reach the device's matmul rate, and 128 chunks each re-read 0.8 GB of accumulator);
- the chunk must fit beside the step's own memory: a fraction of the device's memory, capped.

On a device with memory to spare (`device_memory_bytes` given: a GPU) a chunk takes
`DEVICE_MEMORY_FRACTION` of it, at most `MAX_CHUNK_BYTES`: at a 131,072 vocabulary 4,096 tokens on
an H200 (141 GB), 2,528 on an 80 GB H100. Without it (the CPU) a chunk is `LOGITS_PER_CHUNK`
logits, 256 tokens at that vocabulary, every cpu-demo micro-batch in one chunk. The chunks of a
micro-batch are equal, a multiple of `ROW_ALIGN` tokens where the budget allows, the last taking
the rest (two shapes for a compiled chunk).
"""

from __future__ import annotations

import math

__all__ = ["BYTES_PER_LOGIT", "DEVICE_MEMORY_FRACTION", "LOGITS_PER_CHUNK", "MAX_CHUNK_BYTES", "ROW_ALIGN",
           "chunk_tokens", "max_chunk_tokens"]

# Logit elements per chunk without a device budget: 2^25 fp32 = 128 MiB (the memory planner mirrors it).
LOGITS_PER_CHUNK = 1 << 25
BYTES_PER_LOGIT = 8
DEVICE_MEMORY_FRACTION = 1 / 32
MAX_CHUNK_BYTES = 4 << 30
ROW_ALIGN = 8


def max_chunk_tokens(vocab: int, device_memory_bytes: int | None = None, *,
                     logits_per_chunk: int | None = None) -> int:
    """The most tokens one chunk may take (at least 1): `logits_per_chunk` if given, else the device's
    budget (`device_memory_bytes` × `DEVICE_MEMORY_FRACTION`, at most `MAX_CHUNK_BYTES`), else
    `LOGITS_PER_CHUNK` logits."""
    if vocab < 1:
        raise ValueError(f"vocab must be >= 1, got {vocab}")
    if logits_per_chunk is not None:
        if logits_per_chunk < 1:
            raise ValueError(f"logits_per_chunk must be >= 1, got {logits_per_chunk}")
        return max(1, logits_per_chunk // vocab)
    if device_memory_bytes is None:
        return max(1, LOGITS_PER_CHUNK // vocab)
    if device_memory_bytes < 1:
        raise ValueError(f"device_memory_bytes must be >= 1, got {device_memory_bytes}")
    budget = min(device_memory_bytes * DEVICE_MEMORY_FRACTION, MAX_CHUNK_BYTES)
    tokens = int(budget // (BYTES_PER_LOGIT * vocab))
    return max(1, tokens // ROW_ALIGN * ROW_ALIGN if tokens >= ROW_ALIGN else tokens)


def chunk_tokens(n_tokens: int, vocab: int, device_memory_bytes: int | None = None, *,
                 logits_per_chunk: int | None = None) -> int:
    """Tokens per chunk for `n_tokens` rows: the fewest chunks within `max_chunk_tokens`, equal in
    size, rounded up to a multiple of `ROW_ALIGN` within the budget (the last chunk takes the rest)."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    most = max_chunk_tokens(vocab, device_memory_bytes, logits_per_chunk=logits_per_chunk)
    if n_tokens <= most:
        return n_tokens
    n_chunks = math.ceil(n_tokens / most)
    even = math.ceil(n_tokens / n_chunks)
    aligned = math.ceil(even / ROW_ALIGN) * ROW_ALIGN
    return aligned if aligned <= most else even
