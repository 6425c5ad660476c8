#!/usr/bin/env bash
# build_llama_cpp: builds llama.cpp's llama-bench, llama-server, llama-quantize and
# llama-perplexity, and its prompt-lookup and speculative examples (llama-lookup,
# llama-lookup-create/-merge/-stats, llama-speculative, llama-speculative-simple,
# llama-lookahead), natively from the source that the llama-cpp-python 0.3.36 sdist
# vendors (vendor/llama.cpp): the peer build of the benchmarks (tools/bench_matrix.py,
# tools/bench_speculative.py) and the quantizer and perplexity tool the K-quant tests
# compare with.
#
#     tools/build_llama_cpp.sh [DEST]
#
# DEST defaults to ${XDG_CACHE_HOME:-~/.cache}/armllm/llama.cpp-0.3.36. The binaries land
# in DEST/build/bin/ (statically linked against ggml/llama, so they run from anywhere).
# Idempotent: when every binary exists and answers --help, it only prints where they are.
# Environment: JOBS (parallel compile jobs, default 2: the CPU is shared), NICE (niceness
# of the compile, default 10).
#
# GGML_NATIVE=ON compiles with -march=native, so on Zen 4 ggml uses AVX-512, AVX512_VNNI
# and AVX512_BF16. Less AMX: on a Xeon with AMX (KVM guest, Linux grants tile data),
# this version's AMX matmul (ggml_backend_amx_mul_mat) dies on a general-protection
# fault in ldtilecfg for every Q4_0/Q4_1/Q8_0 model, so -mno-amx-* keeps ggml on its
# AVX-512 VNNI/BF16 kernels there (and changes nothing on CPUs without AMX). No curl/OpenSSL (nothing here downloads models), no web UI (the
# prebuilt UI would be fetched from Hugging Face, which is unreachable), no tests; the
# examples are configured but only the targets named above are built.
set -euo pipefail

VERSION=0.3.36
DEST=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/armllm/llama.cpp-$VERSION}
JOBS=${JOBS:-2}
NICE=${NICE:-10}
SRC=$DEST/src
BUILD=$DEST/build
TARGETS=(llama-bench llama-server llama-quantize llama-perplexity
         llama-lookup llama-lookup-create llama-lookup-merge llama-lookup-stats
         llama-speculative llama-speculative-simple llama-lookahead)

built() {
    local t
    for t in "${TARGETS[@]}"; do
        [[ -x $BUILD/bin/$t ]] || return 1
    done
    # llama-quantize and llama-lookup-merge answer --help with exit status 1: ask the others
    for t in "${TARGETS[@]}"; do
        [[ $t == llama-quantize || $t == llama-lookup-merge ]] && continue
        "$BUILD/bin/$t" --help >/dev/null 2>&1 || return 1
    done
}

list() {
    local t
    for t in "${TARGETS[@]}"; do echo "  $BUILD/bin/$t"; done
}

if built; then
    echo "llama.cpp (llama-cpp-python $VERSION) already built:"
    list
    exit 0
fi

mkdir -p "$DEST"
if [[ ! -f $SRC/CMakeLists.txt ]]; then
    download=$(mktemp -d "$DEST/download.XXXXXX")
    trap 'rm -rf "$download"' EXIT
    # --no-build-isolation: pip still prepares the sdist's metadata, and with build
    # isolation and --no-binary :all: it would compile the build backend's own
    # dependencies (cmake, ninja) from source first; the installed scikit-build-core
    # answers the metadata question in seconds.
    if python -c "import scikit_build_core" 2>/dev/null; then
        isolation=--no-build-isolation
    else
        isolation=
    fi
    echo "downloading the llama-cpp-python $VERSION sdist from PyPI ..."
    python -m pip download --quiet --no-binary :all: --no-deps $isolation \
        "llama-cpp-python==$VERSION" -d "$download"
    sdist=$(ls "$download"/llama_cpp_python-"$VERSION".tar.gz)
    tar -xzf "$sdist" -C "$download" "llama_cpp_python-$VERSION/vendor/llama.cpp"
    rm -rf "$SRC"
    mv "$download/llama_cpp_python-$VERSION/vendor/llama.cpp" "$SRC"
    rm -rf "$download"
fi

echo "configuring $BUILD ..."
generator=()
if command -v ninja >/dev/null; then
    generator=(-G Ninja)
fi
cmake -S "$SRC" -B "$BUILD" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
    -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    >"$DEST/configure.log" 2>&1 || { tail -40 "$DEST/configure.log"; exit 1; }

echo "building ${TARGETS[*]} with $JOBS jobs (log: $DEST/build.log) ..."
nice -n "$NICE" cmake --build "$BUILD" --config Release -j "$JOBS" \
    --target "${TARGETS[@]}" >"$DEST/build.log" 2>&1 \
    || { tail -40 "$DEST/build.log"; exit 1; }

built || { echo "build finished but the binaries do not run" >&2; exit 1; }
echo "built:"
list
