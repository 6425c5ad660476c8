#!/usr/bin/env python3
"""arm_mca_report: a static speed estimate of the Arm micro-kernels' inner
loops with llvm-mca on a Neoverse model (no Arm hardware is needed).

Each Arm kernel file is compiled to assembly with its library's flags (as in
src/armllm/_kernels/meson.build); every innermost loop that does vector
multiply-accumulates (FMLA, BFMMLA, BFDOT, SMMLA, SDOT, SMULL/SMLAL, SVE FMLA/FMAD/SDOT) is fed
to llvm-mca, and the table gives predicted cycles per iteration, MACs per
cycle (at 128-bit vectors, as the N2 model has) and the fraction of the
core's peak for that instruction (2 per cycle on Neoverse N2/V2).
Quantized GEMM kernels (*/quant_gemm.c) ending in _g32 are the group-32 variants:
their innermost loop is one whole group, the int8 block and the float
epilogue the ABI fixes per group (FSUB, FMUL by the group's activation
scale, FMLA); the others' is one 32-k block. Channelwise weights are groups
of 128 since the per-group activation scales, so there are no _cw kernels.

The _g32 loops have a ceiling below the per-block loops' 100%: per group, a
2x2 SMMLA accumulator (4 outputs) takes 4 SMMLA and then at least FSUB,
FMUL, FMLA (4 bits: one more FMLA for o, and the nibble unpack) on the same
two vector pipes, a stored t vector one more (store data), so the
bit-exact ceiling on this model is 4/7 = 57% of SMMLA peak at 8 bits and
4/8 = 50% at 4 bits before the unpack; an SDOT accumulator takes 8 SDOT a
group: 8/11 = 73% and 8/12 = 67%. The float epilogue is the ABI's
(armllm_kernels.h), so only tiling (t in registers, fewer unpacks per
SMMLA) moves these figures.

    tools/arm_mca_report.py [--mcpu neoverse-n2] [--min-macs 8] [--all]

Needs aarch64-linux-gnu-gcc and llvm-mca-16 (apt: gcc-aarch64-linux-gnu llvm-16).
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "src/armllm/_kernels"
# (library, flags): the same -march flags as meson.build gives each library
LIBRARIES = {
    "neon": ["-march=armv8-a"],
    "neon_mmla": ["-march=armv8.6-a+bf16+i8mm"],
    "sve": ["-march=armv8.6-a+sve+bf16+i8mm"],
}
PIPES = 2  # vector FP/ASIMD pipes that take FMLA and BFMMLA on Neoverse N2 (and V2)

# multiply-accumulates per instruction at a 128-bit vector length
MAC_RULES = [
    (re.compile(r"^\s*bfmmla\s"), "BFMMLA", 16),
    (re.compile(r"^\s*[su]mmla\s"), "SMMLA", 32),
    (re.compile(r"^\s*bfdot\s"), "BFDOT", 8),
    (re.compile(r"^\s*(?:[su]dot|sudot|usdot)\s.*\.4s"), "SDOT", 16),
    (re.compile(r"^\s*(?:[su]dot|sudot|usdot)\s+z\d+\.s"), "SDOT", 16),  # SVE (sve/attn.c int8)
    # Armv8.0 int8 fallback (neon/quant_gemm.c without dotprod): 8 int16 products each
    (re.compile(r"^\s*[su]ml[as]l2?\s+v\d+\.8h"), "SMLAL", 8),
    (re.compile(r"^\s*[su]mull2?\s+v\d+\.8h"), "SMLAL", 8),
    (re.compile(r"^\s*f(mla|mls)\s+v\d+\.4s"), "FMLA", 4),
    (re.compile(r"^\s*f(mla|mls)\s+v\d+\.2d"), "FMLA.d", 2),
    (re.compile(r"^\s*f(mla|mls|mad|msb)\s+z\d+\.s"), "FMLA", 4),
]
# b.cond and GCC's dotless aliases (bne, bhi, ...), SVE's b.any/b.first/..., cb(n)z, tb(n)z
BRANCH = re.compile(r"^\s*(b\.?(?:eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le|al|any|none|"
                    r"first|nfrst|last|nlast|tcont|tstop)|b|cbn?z|tbn?z)\s+(?:[^,]*,\s*)*"
                    r"(\.L\w+)\s*$")


def compile_to_asm(src: Path, flags: list[str], out: Path) -> list[str]:
    cmd = ["aarch64-linux-gnu-gcc", "-O3", "-std=c11", "-fno-math-errno", *flags,
           f"-I{KERNELS}", "-S", "-o", str(out), str(src)]
    subprocess.run(cmd, check=True)
    return out.read_text().splitlines()


def innermost_loops(lines: list[str]):
    """(function, body lines) of each loop whose body has no other loop."""
    labels, function = {}, None
    loops = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\w[\w.$]*):", line)
        if m and not line.startswith(".L"):
            function = m.group(1)
        m = re.match(r"^(\.L\w+):", line)
        if m:
            labels[m.group(1)] = i
            continue
        m = BRANCH.match(line)
        if m and m.group(2) in labels and labels[m.group(2)] < i:
            loops.append((function, labels[m.group(2)], i))
    inner = [(f, a, b) for f, a, b in loops
             if not any(a < a2 and b2 <= b and (a2, b2) != (a, b) for _, a2, b2 in loops)]
    for function, start, end in inner:
        body = [ln for ln in lines[start + 1:end + 1]
                if ln.strip() and not ln.lstrip().startswith((".", "//", "@"))
                and not re.match(r"^\.L\w+:", ln)]
        yield function, body


def mac_counts(body: list[str]) -> dict[str, tuple[int, int]]:
    counts: dict[str, tuple[int, int]] = {}
    for line in body:
        for rule, name, macs in MAC_RULES:
            if rule.match(line):
                n, m = counts.get(name, (0, 0))
                counts[name] = (n + 1, m + macs)
                break
    return counts


def mca_cycles(body: list[str], mcpu: str, workdir: Path) -> float:
    asm = workdir / "loop.s"
    asm.write_text("\n".join(body) + "\n")
    out = subprocess.run(["llvm-mca-16", "-mtriple=aarch64", f"-mcpu={mcpu}",
                          "-mattr=+sve,+sve2,+bf16,+i8mm,+dotprod,+lse", "-iterations=500",
                          str(asm)], check=True, capture_output=True, text=True).stdout
    total = int(re.search(r"Total Cycles:\s+(\d+)", out).group(1))
    iters = int(re.search(r"Iterations:\s+(\d+)", out).group(1))
    return total / iters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mcpu", default="neoverse-n2")
    ap.add_argument("--min-macs", type=int, default=8,
                    help="skip loops with fewer multiply-accumulate instructions")
    ap.add_argument("--all", action="store_true", help="every loop, not the best per function")
    args = ap.parse_args()
    for tool in ("aarch64-linux-gnu-gcc", "llvm-mca-16"):
        if not shutil.which(tool):
            print(f"arm_mca_report: {tool} not found (apt-get install gcc-aarch64-linux-gnu "
                  f"llvm-16)", file=sys.stderr)
            return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for lib, flags in LIBRARIES.items():
            for src in sorted((KERNELS / lib).glob("*.c")):
                if src.name == "table.c":
                    continue
                lines = compile_to_asm(src, flags, work / f"{lib}_{src.stem}.s")
                best: dict[str, tuple] = {}
                for index, (function, body) in enumerate(innermost_loops(lines)):
                    counts = mac_counts(body)
                    if sum(n for n, _ in counts.values()) < args.min_macs:
                        continue
                    cycles = mca_cycles(body, args.mcpu, work)
                    kind, (n, macs) = max(counts.items(), key=lambda kv: kv[1][1])
                    row = (f"{lib}/{src.name}", function, kind, n, len(body), cycles,
                           macs / cycles, n / cycles / PIPES)
                    key = f"{function}#{index}" if args.all else function
                    if key not in best or row[-1] > best[key][-1]:
                        best[key] = row
                rows.extend(best.values())
    print(f"llvm-mca -mcpu={args.mcpu}: innermost multiply-accumulate loops, 128-bit vectors, "
          f"peak = {PIPES} per cycle of the loop's main instruction")
    print(f"{'file':<20} {'function':<28} {'instr':<7} {'n':>3} {'ops':>4} {'cyc/it':>7} "
          f"{'MAC/cyc':>8} {'% peak':>7}")
    for file, function, kind, n, ops, cycles, macs, frac in rows:
        print(f"{file:<20} {function[:28]:<28} {kind:<7} {n:>3} {ops:>4} {cycles:7.1f} "
              f"{macs:8.1f} {frac * 100:6.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
