"""ops.mask_logits, the structured-output mask applied to a logits row (portable
C, sample.c), against numpy's unpacking of llguidance's bitmask layout."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armllm import ops
from tests.conftest import examples


@given(st.integers(1, 300), st.data())
@settings(max_examples=examples(60), deadline=None)
def test_mask_kernel_equals_numpy(n, data):
    words = np.array(data.draw(st.lists(st.sampled_from([0, -1, 1, -2**31, 0x55555555,
                                                          -0x12345679]) | st.integers(
        -2**31, 2**31 - 1), min_size=(n + 31) // 32, max_size=(n + 31) // 32)), np.int32)
    row = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)
    want = np.where(allowed, row, -np.inf).astype(np.float32)
    ops.mask_logits(row, words)
    assert np.array_equal(row, want)


def test_mask_kernel_refuses_a_wrong_width():
    with pytest.raises(ValueError, match="must hold 2 entries"):
        ops.mask_logits(np.zeros(40, np.float32), np.zeros(1, np.int32))


