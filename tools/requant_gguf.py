#!/usr/bin/env python3
"""requant_gguf: rewrites a GGUF with its matrices in another type (F16, BF16,
Q8_0, Q4_0), so that llama.cpp can run the same weights in the format armllm
is compared with (tools/bench_matrix.py --extra-gguf), e.g. SmolLM2's Q4_1 demo
GGUF as F16 and Q8_0, as issue 13's SmolLM2 table has them.

    python tools/requant_gguf.py IN.gguf OUT.gguf --type Q8_0

Every metadata key is copied (general.file_type set to match); each tensor of
two or more dimensions is dequantized to f32 by the gguf package and requantized
(llama.cpp's reference rounding), 1-D tensors (norms, biases) stay as stored.
The values are those of IN (a requantization of them), not of the original
higher-precision checkpoint.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

TARGETS = {"F16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
           "BF16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
           "Q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
           "Q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0)}


def requantize(src: Path, dst: Path, target: str) -> None:
    qtype, file_type = TARGETS[target]
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        # the writer adds the architecture and GGUF.* itself; file_type changes
        if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE) \
                or field.name.startswith("GGUF."):
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_file_type(file_type)
    for t in reader.tensors:
        if len(t.shape) < 2:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--type", required=True, choices=sorted(TARGETS))
    args = ap.parse_args(argv)
    if not args.src.is_file():
        print(f"no such GGUF: {args.src}", file=sys.stderr)
        return 2
    if args.dst.exists():
        print(f"{args.dst} exists; not overwriting it", file=sys.stderr)
        return 2
    requantize(args.src, args.dst, args.type)
    print(f"wrote {args.dst} ({args.dst.stat().st_size / 1e6:.1f} MB, {args.type})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
