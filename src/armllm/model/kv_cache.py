"""kv_cache: the paged K/V cache of a model's layers, in KV groups.

A group is the layers whose K/V share one pool of blocks, and so one block
table per sequence (engine/block_manager.py). Layers that attend the whole
sequence form one group; sliding-window layers (Mistral, Mixtral, GPT-OSS's
every other layer) can form a second one whose pool only needs each
sequence's window and the chunk it computes, not its whole length: for
GPT-OSS at 128K context that halves the cache. A window group's arrays hold
one block more than its pool hands out, the null block that table entries
out of every query's window point at (the kernels never read it).

A hybrid model's recurrent layers (Qwen3.5's Gated DeltaNet) keep no K/V:
each holds a state per sequence instead, in the state pool beside the KV
pools: `state_slots` slots of the conv's last inputs [kernel - 1, conv
channels] and the delta rule's matrices [value heads, k_dim, v_dim], float32.
A running sequence holds one slot (engine/block_manager.py hands them out).

An encoder-decoder (Whisper) keeps its cross-attention K and V the same way: per
decoder layer, [heads, state_slots, encoder positions, head_dim] in the KV dtype,
slot s of each head a block of all its window's encoder frames (the attention
kernel reads slot s as block s of a cache whose block size is the encoder's length),
written once when the sequence's encoder runs and freed with the sequence.

An int8 cache (`--kv-cache-dtype int8`) holds each (token, head) row of K and V as
int8 with one bf16 scale beside it, in k_scale / v_scale [n_kv_heads, blocks,
block_size] per layer: quantized by the KV-write kernel, dequantized inside the
attention tiles (armllm_kernels.h). A row of head_dim 64 takes 66 bytes against
bf16's 128, so the same memory holds 1.94x the tokens."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from armllm.model.config import ModelConfig

KV_DTYPE_BYTES = {"bf16": 2, "f32": 4, "int8": 1}
KV_NUMPY_DTYPES = {"bf16": np.uint16, "f32": np.float32, "int8": np.int8}
SCALE_BYTES = 2   # an int8 row's bf16 scale


def check_kv_dtype(config: ModelConfig, dtype: str) -> None:
    """Raises ValueError unless the model's cache can hold dtype."""
    if dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"KV cache dtype must be 'bf16', 'f32' or 'int8', got {dtype!r}")
    if dtype == "int8" and config.encoder is not None:
        raise ValueError("an int8 KV cache is for decoder-only models: an encoder-decoder "
                         "(Whisper) keeps 'bf16' or 'f32'")


def row_bytes(config: ModelConfig, dtype: str) -> int:
    """One token's K (or V) row of one KV head, with an int8 row's scale."""
    return config.head_dim * KV_DTYPE_BYTES[dtype] + (SCALE_BYTES if dtype == "int8" else 0)


@dataclass(frozen=True)
class KVGroup:
    window: int               # tokens a query attends back (0: the whole sequence)
    layers: tuple[int, ...]
    num_blocks: int           # blocks the group's pool hands out


def kv_groups(config: ModelConfig, num_blocks: int,
              num_window_blocks: int | None = None) -> tuple[KVGroup, ...]:
    """The model's KV groups: with num_window_blocks, the sliding layers in a window
    group of that many blocks and the others (if any) in a full group of num_blocks
    (unused when every layer slides); without, every layer in one full group of
    num_blocks."""
    layers = config.attention_layers
    sliding = tuple(i for i in layers if config.window(i))
    if num_window_blocks is None or not sliding:
        return (KVGroup(0, tuple(layers), num_blocks),)
    full = tuple(i for i in layers if not config.window(i))
    window = (KVGroup(config.sliding_window, sliding, num_window_blocks),)
    return ((KVGroup(0, full, num_blocks),) if full else ()) + window


def bytes_per_block(config: ModelConfig, num_layers: int, block_size: int, dtype: str) -> int:
    """K and V of one block of num_layers layers (with an int8 cache's scales)."""
    return 2 * num_layers * config.num_kv_heads * block_size * row_bytes(config, dtype)


# the delta rule kernel's prefill chunk (ARMLLM_GDN_CHUNK): a state checkpoint sits on a
# multiple of it, so that a prefix-cache hit computes in the chunks a miss did
DELTA_CHUNK = 64
# tokens between state checkpoints, at least: each costs a whole state (48 MiB for a 9B)
CHECKPOINT_TOKENS = 256
CHECKPOINTS_PER_LIVE = 4   # live state slots per checkpoint slot


def checkpoint_interval(block_size: int) -> int:
    """Tokens between a hybrid's state checkpoints: the smallest common multiple of the
    block size and DELTA_CHUNK that reaches CHECKPOINT_TOKENS."""
    unit = math.lcm(block_size, DELTA_CHUNK)
    return unit * -(-CHECKPOINT_TOKENS // unit)


def state_slots(config: ModelConfig, max_num_seqs: int, prefix_caching: bool
                ) -> tuple[int, int]:
    """(live, checkpoint) state slots of a hybrid model's pool: one a running sequence,
    and a quarter as many (at least one) for the prefix cache's checkpoints, the states
    of the few prefixes that recur (system prompts); (0, 0) without recurrent layers."""
    if config.encoder is not None:   # cross-attention K/V: no prefix cache of audio
        return max_num_seqs, 0
    if not config.linear_layers:
        return 0, 0
    return max_num_seqs, max(1, max_num_seqs // CHECKPOINTS_PER_LIVE) if prefix_caching else 0


def state_bytes(config: ModelConfig, slots: int, dtype: str = "bf16") -> int:
    """The state pool of `slots` sequences in every recurrent layer (an encoder-decoder's:
    every decoder layer's cross-attention K and V in the KV dtype)."""
    if config.encoder is not None:
        return (2 * slots * config.num_layers * config.kv_size * config.encoder.positions
                * KV_DTYPE_BYTES[dtype])
    if config.delta_net is None:
        return 0
    return 4 * slots * len(config.linear_layers) * config.delta_net.state_floats


def window_pool_blocks(config: ModelConfig, block_size: int, max_num_seqs: int,
                       max_num_batched_tokens: int, max_model_len: int) -> int | None:
    """Blocks of the sliding-window layers' own pool, or None when they need none (no
    sliding layers, or windows that span the context anyway): enough that it never
    runs out before the full one, each running sequence's window plus a partial
    block at either end and the blocks of one step's new tokens, doubled so that
    the prefix cache keeps the windows of recent prefixes (a hit needs the window
    before its first computed token)."""
    if not any(config.window(i) for i in range(config.num_layers)):
        return None
    per_seq = -(-(config.sliding_window - 1) // block_size) + 2
    blocks = 2 * (max_num_seqs * per_seq + -(-max_num_batched_tokens // block_size))
    whole = max_num_seqs * -(-max_model_len // block_size)  # every sequence at full length
    return blocks if blocks < whole else None


class KVCache:
    """Per attention layer K and V of [n_kv_heads, blocks, block_size, head_dim] (each KV
    head a pool of its own: a sequence's consecutive blocks are one run a head), each
    layer's blocks from its KV group's pool (see kv_groups); per recurrent layer its
    conv and delta states of `state_slots` sequences (a hybrid model needs >= 1)."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16,
                 dtype: Literal["bf16", "f32", "int8"] = "bf16",
                 num_window_blocks: int | None = None,
                 state_slots: int = 0):
        if num_blocks < 1 or block_size < 1 or (num_window_blocks is not None
                                                 and num_window_blocks < 1):
            raise ValueError(f"num_blocks, num_window_blocks and block_size must be >= 1, got "
                             f"{num_blocks}, {num_window_blocks}, {block_size}")
        check_kv_dtype(config, dtype)
        stateful = bool(config.linear_layers) or config.encoder is not None
        if stateful and state_slots < 1:
            raise ValueError(f"a hybrid or encoder-decoder model's cache needs state_slots "
                             f">= 1 (one a running sequence), got {state_slots}")
        np_dtype = KV_NUMPY_DTYPES[dtype]
        self.groups = kv_groups(config, num_blocks, num_window_blocks)
        # each layer's group (a recurrent layer's: 0, whose batch carries the state slots)
        self.group_of = [0] * config.num_layers
        self.k: list[np.ndarray] = [None] * config.num_layers
        self.v: list[np.ndarray] = [None] * config.num_layers
        # an int8 cache's row scales (bf16 bits) [n_kv_heads, blocks, block_size]
        self.k_scale: list[np.ndarray | None] = [None] * config.num_layers
        self.v_scale: list[np.ndarray | None] = [None] * config.num_layers
        self._arrays: list[tuple[np.ndarray, ...]] = []   # per group: k, v (, scales)
        for g, group in enumerate(self.groups):
            blocks = group.num_blocks + (1 if group.window else 0)  # + the null block
            shape = (len(group.layers), config.num_kv_heads, blocks, block_size,
                     config.head_dim)
            # Written through once here (numpy backs large arrays with huge pages): pages
            # a decode step touched for the first time cost it a fault each, ~0.5 ms a
            # token on SmolLM2, and the memory is committed up front as llama.cpp and
            # vLLM do.
            arrays = [np.empty(shape, np_dtype), np.empty(shape, np_dtype)]
            if dtype == "int8":
                arrays += [np.empty(shape[:-1], np.uint16), np.empty(shape[:-1], np.uint16)]
            for a in arrays:
                a.fill(0)
            self._arrays.append(tuple(arrays))
            for j, layer in enumerate(group.layers):
                self.group_of[layer] = g
                self.k[layer], self.v[layer] = arrays[0][j], arrays[1][j]
                if dtype == "int8":
                    self.k_scale[layer], self.v_scale[layer] = arrays[2][j], arrays[3][j]
        self.block_size, self.dtype = block_size, dtype
        self.state_slots = state_slots if stateful else 0
        self.conv_state: list[np.ndarray | None] = [None] * config.num_layers
        self.delta_state: list[np.ndarray | None] = [None] * config.num_layers
        d = config.delta_net
        for layer in config.linear_layers:   # written through as the KV arrays are
            self.conv_state[layer] = np.zeros((state_slots, d.conv_kernel - 1, d.conv_size),
                                              np.float32)
            self.delta_state[layer] = np.zeros((state_slots, d.v_heads, d.k_dim, d.v_dim),
                                               np.float32)
        # an encoder-decoder's cross-attention K and V, per decoder layer
        self.cross_k: list[np.ndarray] = []
        self.cross_v: list[np.ndarray] = []
        if config.encoder is not None:
            shape = (config.num_kv_heads, state_slots, config.encoder.positions,
                     config.head_dim)
            for _ in range(config.num_layers):
                self.cross_k.append(np.zeros(shape, np_dtype))
                self.cross_v.append(np.zeros(shape, np_dtype))

    @property
    def num_blocks(self) -> int:
        """The first group's blocks (every layer's, for a model without a window group)."""
        return self.groups[0].num_blocks

    @property
    def pool_layout(self) -> list[tuple[int, int]]:
        """Each group's (window, num_blocks): the BlockManager's pools for this cache."""
        return [(g.window, g.num_blocks) for g in self.groups]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for arrays in self._arrays for a in arrays) + self.state_nbytes

    @property
    def state_nbytes(self) -> int:
        return sum(a.nbytes for a in self._state_arrays())

    def _state_arrays(self) -> list[np.ndarray]:
        return [a for a in (*self.conv_state, *self.delta_state, *self.cross_k, *self.cross_v)
                if a is not None]

    def copy_states(self, copies: list[tuple[int, int]]) -> None:
        """Copies whole state slots (src, dst) in every recurrent layer: a forked
        completion continues from its parent's state."""
        if not copies:
            return
        src = np.fromiter((c[0] for c in copies), np.intp, len(copies))
        dst = np.fromiter((c[1] for c in copies), np.intp, len(copies))
        for a in self._recurrent_arrays():
            a[dst] = a[src]
        for a in (*self.cross_k, *self.cross_v):   # [heads, slots, ...]
            a[:, dst] = a[:, src]

    def copy_blocks(self, copies: list[tuple[int, int, int]]) -> None:
        """Copies whole blocks (group, src, dst) in every layer of the group: copy on
        write of shared blocks."""
        for g, arrays in enumerate(self._arrays):
            pairs = [(src, dst) for group, src, dst in copies if group == g]
            if pairs:
                src = np.fromiter((p[0] for p in pairs), np.intp, len(pairs))
                dst = np.fromiter((p[1] for p in pairs), np.intp, len(pairs))
                for a in arrays:
                    a[:, :, dst] = a[:, :, src]

    def read_block(self, group: int, block: int) -> bytes:
        """A copy of one block's K then V (then an int8 cache's K and V scales) in every
        layer of the group (the prefix cache's files hold these bytes)."""
        return b"".join(a[:, :, block].tobytes() for a in self._arrays[group])

    def write_block(self, group: int, block: int, data: bytes) -> None:
        """Fills one block of the group from read_block's bytes."""
        arrays = self._arrays[group]
        want = sum(a[:, :, block].nbytes for a in arrays)
        if len(data) != want:
            raise ValueError(f"a block of KV group {group} is {want} bytes, got {len(data)}")
        at = 0
        for a in arrays:
            n = a[:, :, block].nbytes
            a[:, :, block] = np.frombuffer(data, a.dtype, n // a.itemsize, at).reshape(
                a[:, :, block].shape)
            at += n

    def _recurrent_arrays(self) -> list[np.ndarray]:
        return [a for a in (*self.conv_state, *self.delta_state) if a is not None]

    def read_state(self, slot: int) -> bytes:
        """A copy of one state slot of every recurrent layer (the prefix cache's
        checkpoint files hold these bytes)."""
        return b"".join(a[slot].tobytes() for a in self._recurrent_arrays())

    def write_state(self, slot: int, data: bytes) -> None:
        """Fills one state slot of every recurrent layer from read_state's bytes."""
        arrays = self._recurrent_arrays()
        want = sum(a[slot].nbytes for a in arrays)
        if len(data) != want:
            raise ValueError(f"a state slot is {want} bytes, got {len(data)}")
        at = 0
        for a in arrays:
            n = a[slot].nbytes
            a[slot] = np.frombuffer(data, a.dtype, n // a.itemsize, at).reshape(a[slot].shape)
            at += n

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: str) -> int:
        """K and V of one block in every attention layer."""
        return bytes_per_block(config, len(config.attention_layers), block_size, dtype)
