#!/usr/bin/env bash
# arm_e2e.sh: armllm on aarch64, end to end, under qemu-user (no Arm machine).
#
# Cross-builds the aarch64 wheel on this x86-64 host (meson cross file,
# aarch64-linux-gnu-gcc), prepares an arm64 Debian root (reused if present,
# else unpacked from a cached tarball, else debootstrapped and then cached),
# installs the wheel there and, for each CPU level, runs under qemu:
#   armllm info --json (features and the kernel chosen per family must match
#   the CPU), the Python kernel tests, and a greedy generation on a tiny
#   random model whose tokens must equal this host's.
#
#   tools/arm_e2e.sh [--levels "neon dotprod i8mm sve256"]
#
# Environment: ARMLLM_ARM64_ROOT (default /opt/armllm-arm64-root),
# ARMLLM_ARM64_CACHE (default /var/cache/armllm-arm64-root.tar.zst).
# Needs root (chroot). Installs its apt packages when missing.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${ARMLLM_ARM64_ROOT:-/opt/armllm-arm64-root}
CACHE=${ARMLLM_ARM64_CACHE:-/var/cache/armllm-arm64-root.tar.zst}
SUITE=bookworm  # Python 3.11, the host's minor version (the wheel's tag comes from the host)
MIRROR=${ARMLLM_ARM64_MIRROR:-http://deb.debian.org/debian}
DEB_PACKAGES="python3 python3-dev python3-venv python3-pip python3-numpy python3-jinja2 pkg-config"
PIP_PACKAGES="tokenizers safetensors jinja2 httpx pytest hypothesis"  # armllm's imports at parse time + tests
STAMP=etc/armllm-arm64.stamp
levels="neon dotprod i8mm sve256"
while [ $# -gt 0 ]; do
  case $1 in
    --levels) levels=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "arm_e2e: unknown argument $1" >&2; exit 2 ;;
  esac
done
note() { echo "arm_e2e: $*" >&2; }
[ "$(id -u)" -eq 0 ] || { note "needs root (chroot, mounts)"; exit 2; }

# ---------------------------------------------------------------- host tools
missing=""
for p in qemu-user-static binfmt-support debootstrap gcc-aarch64-linux-gnu libc6-dev-arm64-cross zstd; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
  note "apt-get install$missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
[ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true

# ----------------------------------------------------------- arm64 root
in_root() {  # in_root QEMU_CPU CMD...: run CMD in the root, /src = the repo
  local cpu=$1; shift
  unshare --mount --propagation private /bin/sh -c '
    set -e; R=$1; SRC=$2; shift 2
    mount -t proc proc "$R/proc"; mount --rbind /dev "$R/dev"
    mkdir -p "$R/src"; mount --bind "$SRC" "$R/src"
    for f in /etc/resolv.conf /etc/ssl/certs/ca-certificates.crt; do
      [ -f "$f" ] && [ -f "$R$f" ] && mount --bind -o ro "$f" "$R$f"
    done
    exec chroot "$R" "$@"' sh "$ROOT" "$repo" \
    /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
      QEMU_CPU="$cpu" /bin/sh -c 'cd /src && exec "$@"' sh "$@"
}

if [ ! -f "$ROOT/$STAMP" ]; then
  rm -rf "$ROOT.partial"; mkdir -p "$ROOT.partial"
  if [ -f "$CACHE" ]; then
    note "unpacking $CACHE"
    tar -C "$ROOT.partial" --zstd -xf "$CACHE"
  else
    note "debootstrap $SUITE arm64 (several minutes; cached afterwards in $CACHE)"
    debootstrap --variant=minbase --arch=arm64 --include="${DEB_PACKAGES// /,}" \
      "$SUITE" "$ROOT.partial" "$MIRROR" >"$ROOT.partial.log" 2>&1 \
      || { tail -20 "$ROOT.partial.log" >&2; exit 1; }
    rm -f "$ROOT.partial"/var/cache/apt/archives/*.deb
  fi
  rm -rf "$ROOT"; mv "$ROOT.partial" "$ROOT"
  if [ ! -f "$ROOT/$STAMP" ]; then
    in_root max sh -c "python3 -m pip install -q --break-system-packages $PIP_PACKAGES"
    echo "$DEB_PACKAGES | $PIP_PACKAGES" >"$ROOT/$STAMP"
    mkdir -p "$(dirname "$CACHE")"
    tar -C "$ROOT" --zstd -cf "$CACHE.tmp" . && mv "$CACHE.tmp" "$CACHE"
    note "cached the root in $CACHE ($(du -h "$CACHE" | cut -f1))"
  fi
fi
if [ "$(cat "$ROOT/$STAMP")" != "$DEB_PACKAGES | $PIP_PACKAGES" ]; then
  # a root (or cached tarball) made for an older package list: add what is new
  note "updating the root's Python packages: $PIP_PACKAGES"
  in_root max sh -c "python3 -m pip install -q --break-system-packages $PIP_PACKAGES"
  echo "$DEB_PACKAGES | $PIP_PACKAGES" >"$ROOT/$STAMP"
  tar -C "$ROOT" --zstd -cf "$CACHE.tmp" . && mv "$CACHE.tmp" "$CACHE"
fi

# -------------------------------------------------------------- the wheel
build=$repo/build/arm64-wheel
mkdir -p "$build"
cat >"$build/python3" <<PY
#!/bin/sh
exec env QEMU_LD_PREFIX=$ROOT LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu/blas:/usr/lib/aarch64-linux-gnu/lapack \\
  qemu-aarch64-static $ROOT/usr/bin/python3 "\$@"
PY
chmod +x "$build/python3"
cat >"$build/cross.ini" <<INI
[binaries]
c = 'aarch64-linux-gnu-gcc'
ar = 'aarch64-linux-gnu-ar'
strip = 'aarch64-linux-gnu-strip'
pkg-config = 'pkg-config'
python = '$build/python3'
exe_wrapper = ['qemu-aarch64-static', '-L', '/usr/aarch64-linux-gnu']

[properties]
sys_root = '$ROOT'
pkg_config_libdir = '$ROOT/usr/lib/aarch64-linux-gnu/pkgconfig:$ROOT/usr/share/pkgconfig'

[built-in options]
c_args = ['-idirafter', '$ROOT/usr/include']

[host_machine]
system = 'linux'
cpu_family = 'aarch64'
cpu = 'aarch64'
endian = 'little'
INI
rm -rf "$repo/dist/arm64"
note "cross-building the aarch64 wheel"
(cd "$repo" && _PYTHON_HOST_PLATFORM=linux-aarch64 python3 -m pip wheel -q --no-build-isolation \
   --no-deps -w dist/arm64 -Cbuild-dir=build/arm64-wheel/meson \
   -Csetup-args=--cross-file="$build/cross.ini" .)
wheel=$(ls "$repo"/dist/arm64/armllm-*-linux_aarch64.whl)
note "built $(basename "$wheel")"

# ------------------------------------------------------------- expected tokens
tiny=$repo/build/arm64-wheel/tiny-model
rm -rf "$tiny"
python3 - "$tiny" <<'PY'
import json, sys
sys.path.insert(0, ".")
from pathlib import Path
from tests.tiny_model import write_tiny_llama
from armllm import LLM, SamplingParams
path = write_tiny_llama(Path(sys.argv[1]))
out = {}
for dtype in ("float32", "bfloat16"):
    llm = LLM(path, dtype=dtype, kv_cache_gib=0.01, kv_cache_dtype="f32")
    res = llm.generate([5, 17, 42, 8], SamplingParams(max_tokens=24, temperature=0.0,
                                                       ignore_eos=True, logprobs=0))[0]
    out[dtype] = {"tokens": res.token_ids, "logprobs": [lp for _, lp, _ in res.logprobs]}
(Path(sys.argv[1]) / "expected.json").write_text(json.dumps(out))
PY

# ------------------------------------------------------------ runs per level
status=0
summary=()
for level in $levels; do
  case $level in
    neon) cpu=cortex-a72; want=neon ;;
    dotprod) cpu=neoverse-n1; want=neon ;;
    i8mm) cpu=max,sve=off; want=neon_mmla ;;
    sve128) cpu=max,sve-default-vector-length=16; want=sve ;;
    sve256) cpu=max,sve-default-vector-length=32; want=sve ;;
    sve512) cpu=max,sve-default-vector-length=64; want=sve ;;
    *) note "unknown level $level"; exit 2 ;;
  esac
  note "level $level (-cpu $cpu): expecting the $want kernels"
  start=$SECONDS
  if in_root "$cpu" sh -c "
      set -e
      rm -rf /tmp/venv && python3 -m venv --without-pip --system-site-packages /tmp/venv
      /tmp/venv/bin/python -m pip install -q --no-deps --force-reinstall dist/arm64/$(basename "$wheel")
      cd /tmp && /tmp/venv/bin/python -m armllm info --json > /tmp/info.json
      /tmp/venv/bin/python - /tmp/info.json $want <<'PY'
import json, sys
info = json.load(open(sys.argv[1])); want = sys.argv[2]
assert info['arch'] == 'aarch64', info['arch']
assert info['isa'] == want, (info['isa'], want)
variants = {impl.split('+')[0] for impl in info['kernels'].values()}  # 'neon+dotprod': neon
assert variants <= {'neon', 'neon_mmla', 'sve'}, info['kernels']
if want == 'neon':  # SDOT exactly where HWCAP has asimddp
    dot = 'asimddp' in info['features']
    assert info['kernels']['gemm_wq'] == ('neon+dotprod' if dot else 'neon'), info['kernels']
print('info ok:', info['isa'], info['features'], 'fetch-add', info['fetch_add'])
PY
      # (the Whisper-shaped cases, 1500-frame attention and LayerNorms, are left to the
      # native runs and to the C driver, which checks those kernels at every Arm level)
      cd /src && ARMLLM_TEST_EXAMPLES=5 /tmp/venv/bin/python -m pytest -q -p no:cacheprovider \
        tests/kernels -k 'not arm_emulation and not whisper' -x
      /tmp/venv/bin/python - build/arm64-wheel/tiny-model <<'PY'
import json, sys
from armllm import LLM, SamplingParams
path = sys.argv[1]
want = json.load(open(path + '/expected.json'))
# log-probabilities of the chosen tokens: f32 kernels differ between ISAs only in
# summation order; bf16 Arm GEMMs (BFMMLA) also round activations to bf16
tolerance = {'float32': 1e-4, 'bfloat16': 0.05}
for dtype, ref in want.items():
    llm = LLM(path, dtype=dtype, kv_cache_gib=0.01, kv_cache_dtype='f32')
    res = llm.generate([5, 17, 42, 8], SamplingParams(max_tokens=24, temperature=0.0,
                                                       ignore_eos=True, logprobs=0))[0]
    assert res.token_ids == ref['tokens'], (dtype, res.token_ids, ref['tokens'])
    diff = max(abs(lp - r) for (_, lp, _), r in zip(res.logprobs, ref['logprobs']))
    assert diff <= tolerance[dtype], (dtype, diff)
    print(f'{dtype}: max |logprob difference| vs x86-64 {diff:.2e} (bound {tolerance[dtype]})')
print('greedy tokens equal the x86-64 run (f32 and bf16 weights)')
PY
    "; then
    summary+=("$(printf '%-10s %-36s PASS  %4ds' "$level" "$cpu" $((SECONDS - start)))")
  else
    summary+=("$(printf '%-10s %-36s FAIL  %4ds' "$level" "$cpu" $((SECONDS - start)))"); status=1
  fi
done
echo "=== aarch64 end to end"
printf '%s\n' "${summary[@]}"
exit $status
