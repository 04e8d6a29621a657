"""The memory planner: per-rank bytes of one rung under one layout, and the smallest layout that fits.

One public name space over three modules, one concept each:

- `ladder.plan.rank_memory`: the per-rank byte model (`Layout`, `MemoryBreakdown`, `memory_breakdown`):
  what one rank holds at its peak, part by part, and what is left out;
- `ladder.plan.layout_search`: the search (`choose_layout`, `LayoutChoice`) for the fewest GPUs whose
  per-rank peak fits a device (at least the GPUs a wall-clock budget needs: `gpus_for_days`), and the
  ep, capacity factor and per-rank bytes of a multi-worker sweep trial (`planned_expert_parallel`,
  `trial_capacity_factor`, `trial_memory`);
- `ladder.plan.byte_sizes`: `parse_bytes` ('141GB') and `format_bytes`.

The routed experts' own bytes are `ladder.plan.expert_memory`'s.
"""

from __future__ import annotations

from ladder.plan.byte_sizes import format_bytes, parse_bytes
from ladder.plan.layout_search import (DEFAULT_HEADROOM, DEFAULT_MAX_GPUS, LayoutChoice, candidate_worlds, choose_layout,
                                       gpus_for_days, planned_expert_parallel, trial_capacity_factor, trial_memory)
from ladder.plan.rank_memory import (BF16_BYTES, CHECKPOINTING, FP32_BYTES, INT64_BYTES, LOGITS_PER_CHUNK, LOSSES,
                                     PRECISIONS, Layout, MemoryBreakdown, job_loss, memory_breakdown, state_bytes)

__all__ = ["BF16_BYTES", "CHECKPOINTING", "DEFAULT_HEADROOM", "DEFAULT_MAX_GPUS", "FP32_BYTES", "INT64_BYTES",
           "LOGITS_PER_CHUNK", "LOSSES", "PRECISIONS", "Layout", "LayoutChoice", "MemoryBreakdown", "candidate_worlds",
           "choose_layout", "format_bytes", "gpus_for_days", "job_loss", "memory_breakdown", "parse_bytes",
           "planned_expert_parallel", "state_bytes", "trial_capacity_factor", "trial_memory"]
