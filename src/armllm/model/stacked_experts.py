"""stacked_experts: GPT-OSS's expert tensors, one per layer for all experts, read as
the per-expert matrices the loader packs.

A GPT-OSS checkpoint stores a sparse layer's experts stacked, under
"model.layers.N.mlp.experts.":
- gate_up_proj_blocks [E, 2I, H/32, 16] uint8 and gate_up_proj_scales [E, 2I, H/32]
  uint8 (the Hub's MXFP4 form: OCP MX e2m1 values, two a byte, the even element in
  the low nibble, under one e8m0 scale per 32: value * 2^(scale - 127)), or
  gate_up_proj [E, H, 2I] as floats (transformers' dequantized save; x @ W);
- down_proj_blocks [E, H, I/32, 16] / down_proj_scales, or down_proj [E, I, H];
- gate_up_proj_bias [E, 2I] and down_proj_bias [E, H].
Rows 2j and 2j + 1 of gate_up are output j of the gate and of the up projection.

StackedExperts answers for the names the loader asks for, "...experts.{e}.gate_proj
.weight", "...up_proj.weight" and "...down_proj.weight" ([N, K] as any Linear): MXFP4
ones as stored, re-laid as GGUF MXFP4 blocks (the e8m0 byte, then value j in the low
and j + 16 in the high nibble of byte j: the same values and scale, no rounding), for
the GGUF-block GEMM; float ones transposed out of the stack.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from armllm.model.gguf import TYPE_IDS, dequantize_rows

MXFP4_BLOCK = 32    # values under one e8m0 scale
_NAME = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")


@dataclass(frozen=True)
class _Slice:
    stem: str      # "model.layers.N.mlp.experts.gate_up_proj" or "....down_proj"
    expert: int
    part: str      # "gate", "up" or "down"
    mxfp4: bool    # stored as _blocks/_scales (else floats)


def mxfp4_to_gguf_blocks(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[rows, K/32 * 17] uint8 GGUF MXFP4 blocks of [rows, K/32, 16] Hub blocks and their
    [rows, K/32] scales."""
    rows, groups = scales.shape
    nibbles = np.empty((rows, groups, MXFP4_BLOCK), np.uint8)
    nibbles[..., 0::2] = blocks & 0x0F
    nibbles[..., 1::2] = blocks >> 4
    out = np.empty((rows, groups, 1 + MXFP4_BLOCK // 2), np.uint8)
    out[..., 0] = scales
    out[..., 1:] = nibbles[..., :16] | (nibbles[..., 16:] << 4)
    return out.reshape(rows, -1)


class StackedExperts:
    """The per-expert view of a checkpoint's stacked GPT-OSS expert tensors; `ckpt` is a
    SafetensorsCheckpoint."""

    def __init__(self, ckpt):
        self.ckpt = ckpt

    def find(self, name: str) -> _Slice | None:
        """The stacked slice behind a per-expert weight name, or None (a tensor of its own,
        or no such expert)."""
        m = _NAME.fullmatch(name)
        if m is None or name in self.ckpt:
            return None
        stem = f"{m[1]}.{'down' if m[3] == 'down' else 'gate_up'}_proj"
        mxfp4 = f"{stem}_blocks" in self.ckpt and f"{stem}_scales" in self.ckpt
        if not mxfp4 and stem not in self.ckpt:
            return None
        s = _Slice(stem, int(m[2]), m[3], mxfp4)
        return s if s.expert < self._stack(s).shape[0] else None

    def _stack(self, s: _Slice) -> np.ndarray:
        return self.ckpt.array(f"{s.stem}_blocks" if s.mxfp4 else s.stem)

    def _rows(self, s: _Slice) -> slice:
        """The slice's rows of its expert's [N, K] form of the stack."""
        return slice(None) if s.part == "down" else slice(0 if s.part == "gate" else 1, None, 2)

    def shape(self, s: _Slice) -> tuple[int, int]:
        a = self._stack(s)
        if s.mxfp4:   # [E, N, K/32, 16]
            n, k = a.shape[1], a.shape[2] * MXFP4_BLOCK
        else:         # [E, K, N]: x @ W
            k, n = a.shape[1], a.shape[2]
        return (n if s.part == "down" else n // 2, k)

    def raw_rows(self, s: _Slice, rows: int):
        """(first row, uint8 GGUF MXFP4 blocks of up to `rows` rows) of an MXFP4 slice."""
        n = self.shape(s)[0]
        blocks = self.ckpt.array(f"{s.stem}_blocks")[s.expert][self._rows(s)]
        scales = self.ckpt.array(f"{s.stem}_scales")[s.expert][self._rows(s)]
        for row0 in range(0, n, rows):
            yield row0, mxfp4_to_gguf_blocks(blocks[row0:row0 + rows], scales[row0:row0 + rows])

    def float_rows(self, s: _Slice, rows: int):
        """(first row, float rows) of a slice: floats transposed out of the stack (bf16
        as uint16 bits), MXFP4 decoded exactly (by the kernels' GGUF decoder)."""
        n, k = self.shape(s)
        if s.mxfp4:
            for row0, raw in self.raw_rows(s, rows):
                yield row0, dequantize_rows(TYPE_IDS["MXFP4"], raw, len(raw), k)
            return
        stack = self.ckpt.array(s.stem)[s.expert]   # [K, N]
        cols = stack[:, self._rows(s)]
        for row0 in range(0, n, rows):
            yield row0, np.ascontiguousarray(cols[:, row0:row0 + rows].T)
