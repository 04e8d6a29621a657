"""token_nll_diff: which targets count as copyable from earlier in the window."""

from __future__ import annotations

import numpy as np

from tests.scripts.helpers import load_script


def test_copyable_marks_targets_whose_kgram_occurred_earlier():
    copyable = load_script("token_nll_diff").copyable
    seq = np.array([9, 1, 2, 3, 1, 2, 3, 1, 2, 4])  # a window: inputs seq[:-1], targets seq[1:]
    flags = copyable(seq[:-1], seq[1:], k=2)
    # 2-grams ending at each target: (9,1) (1,2) (2,3) (3,1) (1,2)* (2,3)* (3,1)* (1,2)* (2,4)
    assert flags.tolist() == [False, False, False, False, True, True, True, True, False]
    assert not copyable(seq[:-1], seq[1:], k=4)[:6].any()  # (1,2,3,1) first repeats at target 6 (from 0)
    assert copyable(seq[:-1], seq[1:], k=4).tolist()[6:] == [True, True, False]
