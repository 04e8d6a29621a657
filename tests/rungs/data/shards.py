"""A real DocumentShard built in memory from document ids and token counts (tokens are zeros)."""

from __future__ import annotations

import numpy as np

from rungs.data.corpus import DocumentShard


def shard_of(doc_lengths: dict[str, int]) -> DocumentShard:
    lengths = np.array(list(doc_lengths.values()), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return DocumentShard("s", "d", np.zeros(int(lengths.sum()), np.uint16),
                         np.stack([starts, lengths, lengths * 4], axis=1), tuple(doc_lengths))
