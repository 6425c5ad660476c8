"""Quantized weight forms (plain numpy, no kernels): round-to-nearest schemes,
the exact mapping of GGUF Q8_0/Q4_0/Q4_1 blocks (against llama.cpp's own gguf
package), and reading compressed-tensors layers and configs."""
from __future__ import annotations

import numpy as np
import pytest

from armllm.model import compressed_tensors as ct
from armllm.model.quantize import (
    SCHEMES,
    QuantizedMatrix,
    from_gguf_blocks,
    num_groups,
    parse_scheme,
    quantize_rtn,
)


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("k", [40, 576, 1536])
def test_rtn_round_trip_error_and_ranges(name, k):
    scheme = SCHEMES[name]
    rng = np.random.default_rng(k)
    w = (rng.standard_normal((24, k)) * rng.uniform(0.01, 3, (24, 1))).astype(np.float32)
    w[3] = 0.0                                   # an all-zero row quantizes to zeros
    qm = quantize_rtn(w, scheme)
    ng = num_groups(k, scheme.group)
    assert qm.q.shape == (24, k) and qm.d.shape == (24, ng) and qm.q.dtype == np.int8
    g = qm.group_index()
    step = qm.d[:, g]
    err = np.abs(qm.dequantize() - w)
    if scheme.bits == 8:
        assert qm.o is None and np.abs(qm.q).max() <= 127
        assert (err <= 0.5 * step + 1e-7).all()
    else:
        assert 0 <= qm.q.min() and qm.q.max() <= 15
        np.testing.assert_array_equal(qm.o, -8 * qm.d)
        # symmetric int4 in [-8, 7] with d = amax / 7.5: the top value clamps by 0.5 step
        assert (err <= 1.0 * step + 1e-7).all()
    assert not qm.dequantize()[3].any()


def test_groups_follow_the_padded_width():
    assert num_groups(576, 128) == 5 and num_groups(40, 32) == 2 and num_groups(100, 0) == 1
    qm = quantize_rtn(np.ones((2, 576), np.float32), SCHEMES["w4a8-g128"])
    assert qm.d.shape == (2, 5)


def test_bad_inputs():
    with pytest.raises(ValueError, match="quantization must be none or one of"):
        parse_scheme("w3a3")
    assert parse_scheme("none") is None
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_rtn(np.array([[1.0, np.nan]], np.float32), SCHEMES["w8a8"])
    with pytest.raises(ValueError, match=r"expected \[2, 1\]"):
        QuantizedMatrix(np.zeros((2, 8), np.int8), np.zeros((2, 3), np.float32), None, 8, 0)
    with pytest.raises(ValueError, match=r"4-bit values must lie in \[0, 15\]"):
        QuantizedMatrix(np.full((1, 8), 16, np.int8), np.ones((1, 1), np.float32),
                        np.zeros((1, 1), np.float32), 4, 0)


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1"])
def test_gguf_blocks_map_exactly(type_name):
    gguf = pytest.importorskip("gguf")
    from armllm.model.gguf import dequantize_rows
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 96)).astype(np.float32)
    raw = gguf.quants.quantize(w, qtype)             # llama.cpp's reference quantizer
    blocks = raw.reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1])
    qm = from_gguf_blocks(type_name, blocks, 6, 96)
    assert (qm.bits, qm.group) == ((8, 32) if type_name == "Q8_0" else (4, 32))
    want = gguf.quants.dequantize(raw, qtype)
    np.testing.assert_array_equal(dequantize_rows(int(qtype), raw, 6, 96), want)
    # our (d, q, o) reproduce llama.cpp's dequantization exactly in float64 arithmetic
    g = qm.group_index()
    exact = qm.q.astype(np.float64) * qm.d[:, g] + (0 if qm.o is None else qm.o[:, g])
    np.testing.assert_allclose(exact, want, rtol=0, atol=1e-6)


# -- compressed-tensors --------------------------------------------------------------------

def ct_config(**weights) -> dict:
    w = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
         "group_size": None, "dynamic": False, **weights}
    return {"quantization_config": {
        "quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
                                      "input_activations": {"num_bits": 8, "type": "int",
                                                            "strategy": "token",
                                                            "dynamic": True}}}}}


@pytest.mark.parametrize("change, message", [
    ({"type": "float"}, r"weights.type 'float' is not supported"),
    ({"num_bits": 2}, "num_bits 2 is not supported"),
    ({"strategy": "tensor"}, "strategy 'tensor' is not supported"),
    ({"strategy": "group", "group_size": 16}, "group_size 16 is not supported"),
    ({"actorder": "group"}, "actorder 'group' is not supported"),
])
def test_unsupported_configs_name_the_setting(change, message):
    with pytest.raises(ValueError, match=message):
        ct.parse_config(ct_config(**change), "m/config.json")


def test_unsupported_method_and_static_activations():
    with pytest.raises(ValueError, match="quant_method 'gptq' is not supported"):
        ct.parse_config({"quantization_config": {"quant_method": "gptq"}}, "x")
    cfg = ct_config()
    cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"]["dynamic"] = False
    with pytest.raises(ValueError, match="static activation scales are not supported"):
        ct.parse_config(cfg, "x")
    assert ct.parse_config({"hidden_size": 3}, "x") is None


def test_targets_and_ignore():
    cfg = ct.parse_config(ct_config(), "x")
    assert cfg.weight_args("model.layers.0.mlp.down_proj")[0] == ct.WeightArgs(8, 0, True)
    assert cfg.weight_args("lm_head") is None


def _tensors_getter(tensors: dict):
    return tensors.__getitem__, tensors.__contains__


def test_int8_channel_layer():
    rng = np.random.default_rng(2)
    q = rng.integers(-128, 128, (5, 64)).astype(np.int8)
    s = rng.uniform(0.001, 0.01, (5, 1)).astype(np.float32)
    get, has = _tensors_getter({"l.weight": q, "l.weight_scale": s})
    qm = ct.load_matrix(get, has, "l", ct.WeightArgs(8, 0, True), "int-quantized", (5, 64), "m")
    want = np.clip(q, -127, 127).astype(np.float32) * s     # -128 moves one step up
    np.testing.assert_array_equal(qm.dequantize(), want)


def test_int4_group_with_zero_points_unpacked_and_packed():
    rng = np.random.default_rng(3)
    n, k, g = 16, 96, 32
    v = rng.integers(-8, 8, (n, k)).astype(np.int8)
    s = rng.uniform(0.01, 0.1, (n, k // g)).astype(np.float32)
    zp = rng.integers(-3, 4, (n, k // g)).astype(np.int8)
    want = (v.astype(np.float32) - np.repeat(zp, g, axis=1)) * np.repeat(s, g, axis=1)
    args = ct.WeightArgs(4, g, False)
    get, has = _tensors_getter({"l.weight": v, "l.weight_scale": s, "l.weight_zero_point": zp})
    unpacked = ct.load_matrix(get, has, "l", args, "int-quantized", (n, k), "m")
    np.testing.assert_allclose(unpacked.dequantize(), want, atol=1e-6)

    def pack(vals: np.ndarray, axis: int) -> np.ndarray:   # value + 8 in 4 bits, low first
        u = (vals.astype(np.int64) + 8).astype(np.uint32)
        if axis == 0:
            u = u.T
        words = np.zeros((u.shape[0], u.shape[1] // 8), np.uint32)
        for i in range(8):
            words |= u[:, i::8] << (4 * i)
        words = words.view(np.int32)
        return words if axis == 1 else np.ascontiguousarray(words.T)

    get, has = _tensors_getter({"l.weight_packed": pack(v, 1), "l.weight_scale": s,
                                "l.weight_zero_point": pack(zp, 0),
                                "l.weight_shape": np.array([n, k])})
    packed = ct.load_matrix(get, has, "l", args, "pack-quantized", (n, k), "m")
    np.testing.assert_allclose(packed.dequantize(), want, atol=1e-6)


def test_wrong_scale_shape_names_the_tensor():
    get, has = _tensors_getter({"l.weight": np.zeros((4, 32), np.int8),
                                "l.weight_scale": np.ones((3, 1), np.float32)})
    with pytest.raises(ValueError, match=r"tensor l.weight_scale has shape \[3, 1\], "
                                         r"expected \[4, 1\]"):
        ct.load_matrix(get, has, "l", ct.WeightArgs(8, 0, True), "int-quantized", (4, 32), "m")
