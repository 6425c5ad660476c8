#!/usr/bin/env bash
# arm_kernel_check.sh: cross-builds the C kernels and their test driver
# (tests/kernels/c/kernel_check.c) for aarch64 and runs them under qemu-user
# at every CPU level the dispatch distinguishes, then prints a pass/fail table.
#
#   tools/arm_kernel_check.sh [--install] [--quick] [BUILD_DIR]
#
# --install  apt-installs the cross compiler and qemu-user-static if missing.
# Levels: cortex-a72 (Armv8.0 NEON, no LSE: the LL/SC fetch-add), neoverse-n1
# (dotprod + LSE), max,sve=off (BF16/I8MM, no SVE), max at SVE 128/256/384/512.
# Also checks that the pool and all-reduce objects contain LDADDAL.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
install=no quick=""
build=""
for arg in "$@"; do
  case $arg in
    --install) install=yes ;;
    --quick) quick=--quick ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) build=$arg ;;
  esac
done
build=${build:-$here/build/arm64-check}

if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64-static >/dev/null; then
  if [ $install = yes ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static binutils-aarch64-linux-gnu >/dev/null
  else
    echo "arm_kernel_check: needs aarch64-linux-gnu-gcc and qemu-aarch64-static (run with --install)" >&2
    exit 2
  fi
fi

mkdir -p "$build"
cross=$build/cross.ini
cat >"$cross" <<INI
[binaries]
c = 'aarch64-linux-gnu-gcc'
ar = 'aarch64-linux-gnu-ar'
strip = 'aarch64-linux-gnu-strip'
exe_wrapper = ['qemu-aarch64-static', '-L', '/usr/aarch64-linux-gnu']

[host_machine]
system = 'linux'
cpu_family = 'aarch64'
cpu = 'aarch64'
endian = 'little'
INI

if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$here" --cross-file "$cross" -Dext=false -Dkernel_check=true >"$build/setup.log" 2>&1 \
    || { tail -30 "$build/setup.log" >&2; exit 1; }
fi
ninja -C "$build" >"$build/ninja.log" 2>&1 || { cat "$build/ninja.log" >&2; exit 1; }
if grep -q "warning:" "$build/ninja.log"; then
  grep "warning:" "$build/ninja.log" >&2
  echo "arm_kernel_check: the aarch64 build has warnings" >&2
  exit 1
fi
exe=$build/src/armllm/_kernels/kernel_check

status=0
for obj in pool comm; do
  path=$(find "$build" -name "$obj.c.o" | head -1)
  if aarch64-linux-gnu-objdump -d "$path" | grep ldaddal >/dev/null; then
    echo "$obj.c.o contains ldaddal: yes"
  else
    echo "$obj.c.o contains ldaddal: NO"; status=1
  fi
done

summary=()
run_level() {
  local label=$1 cpu=$2
  echo
  echo "=== $label (-cpu $cpu)"
  if qemu-aarch64-static -L /usr/aarch64-linux-gnu -cpu "$cpu" "$exe" $quick; then
    summary+=("$(printf '%-28s PASS' "$label")")
  else
    summary+=("$(printf '%-28s FAIL' "$label")"); status=1
  fi
}
run_level "armv8.0 neon, no lse" cortex-a72
run_level "armv8.2 dotprod + lse" neoverse-n1
run_level "armv8.6 bf16/i8mm, no sve" max,sve=off
run_level "sve 128" max,sve-default-vector-length=16
run_level "sve 256" max,sve-default-vector-length=32
run_level "sve 384" max,sve-default-vector-length=48  # not a power of two
run_level "sve 512" max,sve-default-vector-length=64

echo
echo "=== summary"
printf '%s\n' "${summary[@]}"
exit $status
