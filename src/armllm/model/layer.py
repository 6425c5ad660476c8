"""layer: the vocabulary an architecture file declares its decoder layer in.

A layer is a short tuple of fused steps over the Workspace's buffers, run in
order by one C call (_kernels/layer.pxi's DecoderLayer) with no Python per op:

    residual  the residual stream           x        a sub-layer's output
    normed    a norm's output               qkv      [q | k | v] rows
    attn      attention's output            gate_up  [gate | up] rows
    act       act(gate) * up

Each step names what it reads and writes by its kind; the linear weights it
multiplies by are the LayerWeights slots LINEARS names (qkv, o, gate_up, down).
The Llama layer is

    NormLinear("input_norm", "qkv"), RopeKV(), Attention(), Linear("o"),
    NormLinear("post_norm", "gate_up"), Act("silu"), Linear("down")

and Gemma 3's adds QKNorm() before RopeKV() and Norm("post_attn_norm") /
Norm("post_mlp_norm") after each projection. A hybrid's recurrent layer
(Qwen3.5's Gated DeltaNet) mixes tokens with DeltaNet() in place of QKNorm /
RopeKV / Attention, over its state instead of a KV cache. `plan`, sharding, the Workspace
and the loader read a layer's steps, never its architecture's name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LINEARS = ("qkv", "o", "gate_up", "down")   # a layer's packed linear weights, in bind order
ACTIVATIONS = ("silu", "gelu_tanh")          # the dense MLP's act(gate) * up kernels


@dataclass(frozen=True)
class NormLinear:
    """residual += x (skipped by layer 0, whose input is the residual itself);
    normed = rms_norm(residual, weights.<norm>) (quantized on the way for a quantized
    weight); qkv or gate_up = normed @ weights.<linear>.T (+ its bias)."""
    norm: str
    linear: Literal["qkv", "gate_up"]


@dataclass(frozen=True)
class QKNorm:
    """RMSNorm over each head of q and k (weights.q_norm, weights.k_norm [head_dim])."""


@dataclass(frozen=True)
class RopeKV:
    """RoPE (neox pairing) on q and k at the rows' positions, from the model's rope
    table `table` ("global"; Gemma 3's sliding layers: "local"), rotating the first
    rot_dim dims of each head (the config's partial rotary), then K and V written to
    the layer's cache slots."""
    table: Literal["global", "local"] = "global"


@dataclass(frozen=True)
class Attention:
    """Causal paged attention of q over the layer's cache: the last `window` tokens
    (0: all), scores times `scale` (None: head_dim ** -0.5), each head's sink logit in
    its softmax denominator when `sinks` (weights.sinks)."""
    window: int = 0
    scale: float | None = None
    sinks: bool = False


@dataclass(frozen=True)
class OutputGate:
    """attn *= sigmoid(gate), the gate each query head's second half of q_proj's rows
    (qkv holds q_proj's rows as stored: per head [q | gate], then k and v)."""


@dataclass(frozen=True)
class DeltaNet:
    """The Gated DeltaNet mixer over qkv = the input projection [q | k | v | z]
    (config.delta_net's shape) and [b | a] = normed @ weights.delta.ba.T (a small float
    matrix of its own): a causal depthwise conv (SiLU) of [q | k | v] continuing the
    sequence's conv state, the gated delta rule continuing its matrix state (decay
    -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), L2-normed q and k), then
    attn = rms_norm(out, weights.delta.norm) * silu(z) per value head."""


@dataclass(frozen=True)
class Linear:
    """x = attn @ weights.o.T or act @ weights.down.T (+ bias); a tensor-parallel rank
    all-reduces x over the ranks (row-parallel)."""
    linear: Literal["o", "down"]


@dataclass(frozen=True)
class Norm:
    """x = rms_norm(x, weights.<norm>): a post-norm on a sub-layer's output before it
    joins the residual stream (Gemma's sandwich norms)."""
    norm: str


@dataclass(frozen=True)
class Act:
    """act = act(gate) * up over gate_up's halves: silu (SwiGLU) or gelu_tanh (GeGLU)."""
    kind: Literal["silu", "gelu_tanh"] = "silu"


@dataclass(frozen=True)
class SparseMLP:
    """residual += x; normed = rms_norm(residual, weights.<norm>); x = the sum of each
    row's top-k experts on normed (model/moe.py), and with `shared` a dense expert every
    row runs (the layer's gate_up and down weights) times sigmoid(normed .
    weights.shared_gate) (Qwen3.5-MoE); all-reduced on a tensor-parallel rank."""
    norm: str
    shared: bool = False


Step = (NormLinear | QKNorm | RopeKV | Attention | OutputGate | DeltaNet | Linear | Norm | Act
        | SparseMLP)


def llama_steps(window: int = 0, qk_norm: bool = False, sinks: bool = False,
                sparse: bool = False) -> tuple[Step, ...]:
    """The pre-norm Llama layer most families share: attention with optional q/k norms,
    a window and sinks, then a dense SwiGLU MLP or a sparse one."""
    attention = (NormLinear("input_norm", "qkv"), *((QKNorm(),) if qk_norm else ()),
                 RopeKV(), Attention(window=window, sinks=sinks), Linear("o"))
    if sparse:
        return (*attention, SparseMLP("post_norm"))
    return (*attention, NormLinear("post_norm", "gate_up"), Act("silu"), Linear("down"))


def step_norms(steps: tuple[Step, ...]) -> tuple[str, ...]:
    """The LayerWeights norm vectors [hidden] the steps read, in step order."""
    return tuple(s.norm for s in steps if isinstance(s, NormLinear | Norm | SparseMLP))


def has_step(steps: tuple[Step, ...], kind: type) -> bool:
    return any(isinstance(s, kind) for s in steps)


def attention_step(steps: tuple[Step, ...]) -> Attention | None:
    """The layer's Attention step (None: a recurrent layer)."""
    return next((s for s in steps if isinstance(s, Attention)), None)
