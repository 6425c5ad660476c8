"""compressed_tensors: reading and writing compressed-tensors checkpoints
(the format of llm-compressor / RedHatAI `*-quantized.w8a8` models):
`int-quantized` (int8 weight tensors; 4-bit values stored unpacked) and
`pack-quantized` (4-bit values packed eight per int32, run as W4A8), with
channel or group strategy, symmetric or with zero points.

Layouts follow ../shared/reference/FORMATS.md: `weight` int8 [out, in] or
`weight_packed` int32 [out, in/8] (value + 8 in 4 bits, low nibble first) with
`weight_shape`; `weight_scale` [out, 1] (channel) or [out, ceil(in/g)]
(group); optional `weight_zero_point` (same shape; packed along dim 0 in
pack-quantized). Anything else is refused with the tensor or setting named."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from armllm.model.quantize import QuantizedMatrix, num_groups

LINEAR_SUFFIXES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                   "lm_head")


@dataclass(frozen=True)
class WeightArgs:
    bits: int
    group: int          # 0: channel
    symmetric: bool
    act_symmetric: bool = True   # input_activations.symmetric


@dataclass
class CTConfig:
    format: str
    groups: list[tuple[list[str], WeightArgs, str]]   # (targets, weight args, format)
    ignore: list[str]
    source: str

    def weight_args(self, module: str) -> tuple[WeightArgs, str] | None:
        """The scheme of a Linear module (full name, e.g. model.layers.0.mlp.down_proj), or
        None when it is ignored or untargeted (kept in its float dtype)."""
        if any(_matches(pattern, module) for pattern in self.ignore):
            return None
        for targets, args, fmt in self.groups:
            if any(t == "Linear" or _matches(t, module) for t in targets):
                return args, fmt
        return None


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return name == pattern or name.endswith("." + pattern)


def parse_config(cfg: dict, source: str) -> CTConfig | None:
    """The checkpoint's quantization, or None for a plain float checkpoint; ValueError
    for quantization armllm cannot run, naming the setting."""
    qc = cfg.get("quantization_config")
    if qc is None:
        return None
    method = qc.get("quant_method")
    if method == "mxfp4":   # GPT-OSS's experts: *_blocks/*_scales, read by stacked_experts
        return None
    if method != "compressed-tensors":
        raise ValueError(f"{source}: quantization_config.quant_method {method!r} is not "
                         "supported (supported: compressed-tensors, mxfp4)")
    top_format = qc.get("format", "int-quantized")
    groups = []
    for gname, group in (qc.get("config_groups") or {}).items():
        where = f"{source}: quantization_config.config_groups.{gname}"
        w = group.get("weights")
        if not w:
            continue
        fmt = group.get("format") or top_format
        if fmt not in ("int-quantized", "pack-quantized", "naive-quantized"):
            raise ValueError(f"{where}: format {fmt!r} is not supported (supported: "
                             "int-quantized, pack-quantized, naive-quantized)")
        if w.get("type", "int") != "int":
            raise ValueError(f"{where}.weights.type {w.get('type')!r} is not supported (only "
                             "int; fp8 and other float formats are not)")
        bits = w.get("num_bits")
        if bits not in (4, 8):
            raise ValueError(f"{where}.weights.num_bits {bits!r} is not supported (4 or 8)")
        strategy = w.get("strategy")
        if strategy == "channel":
            gsize = 0
        elif strategy == "group":
            gsize = w.get("group_size")
            if gsize not in (32, 64, 128):
                raise ValueError(f"{where}.weights.group_size {gsize!r} is not supported "
                                 "(32, 64 or 128)")
        else:
            raise ValueError(f"{where}.weights.strategy {strategy!r} is not supported "
                             "(channel or group)")
        if w.get("actorder") not in (None, "static"):
            raise ValueError(f"{where}.weights.actorder {w.get('actorder')!r} is not "
                             "supported (activation-order g_idx)")
        if w.get("dynamic") not in (None, False):
            raise ValueError(f"{where}.weights.dynamic must be false for stored weights")
        if bits == 8 and w.get("symmetric", True) is False:
            raise ValueError(f"{where}: asymmetric 8-bit weights are not supported")
        acts = group.get("input_activations")
        if acts and (acts.get("type", "int") != "int" or acts.get("num_bits") != 8):
            raise ValueError(f"{where}.input_activations: only int8 activations are supported, "
                             f"got {acts.get('type')} {acts.get('num_bits')}-bit")
        if acts and acts.get("dynamic") is False:
            raise ValueError(f"{where}.input_activations: static activation scales are not "
                             "supported (armllm quantizes activations per token)")
        if acts and acts.get("strategy", "token") not in ("token", "tensor"):
            raise ValueError(f"{where}.input_activations.strategy {acts.get('strategy')!r} is "
                             "not supported (token or tensor: armllm quantizes per token and "
                             "per group of the weight, never coarser)")
        act_sym = bool(acts.get("symmetric", True)) if acts else True
        groups.append((list(group.get("targets") or []),
                       WeightArgs(bits, gsize, w.get("symmetric", True), act_sym), fmt))
    if not groups:
        raise ValueError(f"{source}: quantization_config has no weight quantization")
    return CTConfig(top_format, groups, list(qc.get("ignore") or []), source)


def _unpack_int4(packed: np.ndarray, count: int, axis: int) -> np.ndarray:
    """int32 words holding 8 values of 4 bits (low nibble first) -> uint8 values, along
    axis, keeping `count` of them."""
    words = np.ascontiguousarray(packed).view(np.uint32)
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    if axis == 1:
        vals = (words[:, :, None] >> shifts) & 0xF
        return vals.reshape(words.shape[0], -1)[:, :count].astype(np.uint8)
    vals = (words[:, None, :] >> shifts[None, :, None]) & 0xF
    return vals.reshape(-1, words.shape[1])[:count].astype(np.uint8)


def load_matrix(get, has, prefix: str, args: WeightArgs, fmt: str, shape: tuple[int, int],
                source: str) -> QuantizedMatrix:
    """One quantized Linear (`prefix` = module name) as the kernels' (q, d, o)."""
    n, k = shape
    ng_ct = 1 if args.group == 0 else -(-k // args.group)

    def tensor(name: str) -> np.ndarray:
        full = f"{prefix}.{name}"
        if not has(full):
            raise ValueError(f"{source}: missing tensor {full}")
        return get(full)

    if has(f"{prefix}.weight_packed"):
        packed = tensor("weight_packed")
        if packed.dtype != np.int32 or packed.shape != (n, -(-k * args.bits // 32)):
            raise ValueError(f"{source}: tensor {prefix}.weight_packed has shape "
                             f"{list(packed.shape)} {packed.dtype}, expected "
                             f"[{n}, {-(-k * args.bits // 32)}] int32")
        if args.bits != 4:
            raise ValueError(f"{source}: {prefix}: packed {args.bits}-bit weights are not "
                             "supported")
        stored = _unpack_int4(packed, k, axis=1).astype(np.int16) - 8   # values in [-8, 7]
    else:
        w = tensor("weight")
        if w.dtype != np.int8 or w.shape != (n, k):
            raise ValueError(f"{source}: tensor {prefix}.weight has shape {list(w.shape)} "
                             f"{w.dtype}, expected [{n}, {k}] int8 for a quantized layer")
        stored = w.astype(np.int16)
    scale = _float(tensor("weight_scale"))
    if scale.shape not in ((n, ng_ct), (n,)):
        raise ValueError(f"{source}: tensor {prefix}.weight_scale has shape "
                         f"{list(scale.shape)}, expected [{n}, {ng_ct}]")
    scale = scale.reshape(n, ng_ct)
    zp = None
    if has(f"{prefix}.weight_zero_point"):
        raw = get(f"{prefix}.weight_zero_point")
        if fmt == "pack-quantized" and raw.dtype == np.int32 and raw.shape[0] == -(-n // 8) \
                and args.bits == 4:
            zp = _unpack_int4(raw, n, axis=0).astype(np.int16) - 8
        else:
            zp = raw.astype(np.int16)
        if zp.reshape(-1).size != n * ng_ct:
            raise ValueError(f"{source}: tensor {prefix}.weight_zero_point has shape "
                             f"{list(raw.shape)}, expected [{n}, {ng_ct}]")
        zp = zp.reshape(n, ng_ct)
        if not zp.any():
            zp = None
    lo, hi = (-8, 7) if args.bits == 4 else (-128, 127)
    if stored.size and (stored.min() < lo or stored.max() > hi):
        raise ValueError(f"{source}: tensor {prefix}: values outside [{lo}, {hi}] for "
                         f"{args.bits}-bit weights")
    # groups are multiples of 32, so counting them over K or K rounded up to 32 agrees
    assert num_groups(k, args.group) == ng_ct
    if args.bits == 8:
        if zp is not None:
            raise ValueError(f"{source}: {prefix}: 8-bit weights with zero points are not "
                             "supported")
        # -128 has no exact place in the kernels' symmetric [-127, 127]: one step up
        q = np.clip(stored, -127, 127).astype(np.int8)
        return QuantizedMatrix(q, scale, None, 8, args.group, args.act_symmetric)
    q = (stored + 8).astype(np.int8)
    zp_f = np.zeros_like(scale) if zp is None else zp.astype(np.float32)
    return QuantizedMatrix(q, scale, (-scale * (8.0 + zp_f)).astype(np.float32), 4, args.group,
                           args.act_symmetric)


def _float(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.uint16:  # bf16 bits
        return (a.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(a, dtype=np.float32)


# -- writing ---------------------------------------------------------------------------------

def quantization_config(bits: int, group: int, ignore: list[str],
                        act_symmetric: bool = True) -> dict:
    """config.json's quantization_config for armllm's RTN output: int-quantized, symmetric
    weights (channel or group), dynamic per-token int8 activations (symmetric or not)."""
    weights = {"num_bits": bits, "type": "int", "symmetric": True,
               "strategy": "group" if group else "channel", "group_size": group or None,
               "dynamic": False, "actorder": None, "observer": "minmax", "block_structure": None,
               "observer_kwargs": {}}
    acts = {"num_bits": 8, "type": "int", "symmetric": act_symmetric, "strategy": "token",
            "dynamic": True, "group_size": None, "actorder": None, "observer": None,
            "block_structure": None, "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "int-quantized",
            "quantization_status": "compressed", "ignore": ignore, "kv_cache_scheme": None,
            "global_compression_ratio": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": acts,
                                          "output_activations": None,
                                          "format": "int-quantized"}}}


def matrix_tensors(prefix: str, qm: QuantizedMatrix, k: int) -> dict[str, np.ndarray]:
    """A symmetric QuantizedMatrix as int-quantized tensors: weight int8 (4-bit values in
    [-8, 7] unpacked) and weight_scale float32 [out, groups over K]."""
    ng_ct = 1 if qm.group == 0 else -(-k // qm.group)
    q = qm.q.astype(np.int16)
    if qm.bits == 4:
        if qm.o is None or not np.array_equal(qm.o, -8.0 * qm.d):
            raise ValueError(f"{prefix}: only symmetric 4-bit weights can be written")
        q = q - 8
    return {f"{prefix}.weight": q.astype(np.int8),
            f"{prefix}.weight_scale": np.ascontiguousarray(qm.d[:, :ng_ct], dtype=np.float32)}
