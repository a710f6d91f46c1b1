#!/usr/bin/env bash
# Runs kernel code on the CPU emulator (dev/emu.hpp), for a machine without a GPU: the GPU kernel tests
# (tests/gpu/test_kernels.cu) with Catch2 filters, and / or the flash-attention lab's validation.
#
#   tools/emu_check.sh tests "[attention_heads]" "gelu_mul*"    # the kernel tests, these filters (default: all)
#   tools/emu_check.sh suite "[parity]" "[batch]"               # the whole GPU suite: the CUDA backend too
#   tools/emu_check.sh lab 1,2,3                                # lab_flash_attention's validation, versions
#
# Builds into ${EMU_BUILD:-build-emu} with g++ (nothing from CUDA is linked: dev/emu.hpp defines the runtime
# calls). What the emulator does and does not check: dev/README.md, "Running kernels on the CPU". Tests that
# compare register counts, shared memory or timings learn nothing here; results agree with a GPU to rounding.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-tests}
shift || true
mkdir -p "${EMU_BUILD:-build-emu}"
out=$(cd "${EMU_BUILD:-build-emu}" && pwd)
cuda_inc=${CUDA_INCLUDE:-/usr/local/cuda/include}
deps_inc=()
[ -d .deps/usr/include ] && deps_inc=(-I.deps/usr/include)
flags=(-std=c++17 -O1 -fno-strict-aliasing -Wno-unknown-pragmas -I"$cuda_inc" -Iinclude -I. "${deps_inc[@]}")

case "$what" in
  tests)
    g++ "${flags[@]}" -x c++ -include dev/emu.hpp -DGEMMA4_T4_EMU_MAIN -c tests/gpu/main.cpp -o "$out/main.o"
    g++ "${flags[@]}" -x c++ -include dev/emu.hpp -c tests/gpu/test_kernels.cu -o "$out/test_kernels.o"
    g++ "$out/main.o" "$out/test_kernels.o" -o "$out/test_kernels_emu" -lpthread
    if [ $# -eq 0 ]; then
      exec "$out/test_kernels_emu" -d yes
    fi
    rc=0
    for f in "$@"; do "$out/test_kernels_emu" "$f" -d yes || rc=1; done
    exit $rc
    ;;
  suite)
    # the whole GPU suite: src/impl.cu (the CUDA backend), every tests/gpu source, make_synthetic for the cases
    # that build checkpoints
    g++ -std=c++17 -O2 "${deps_inc[@]}" tools/make_synthetic.cpp -o "$out/make_synthetic" -lpthread
    defs=(-DGEMMA4_T4_FIXTURES="\"$PWD/tests/fixtures\"" -DGEMMA4_T4_MAKE_SYNTHETIC="\"$out/make_synthetic\"")
    objs=()
    for f in src/impl.cu tests/gpu/*.cpp tests/gpu/*.cu; do
      o="$out/$(basename "$f").o"
      main=()
      [ "$(basename "$f")" = main.cpp ] && main=(-DGEMMA4_T4_EMU_MAIN)
      g++ "${flags[@]}" -Itests "${defs[@]}" -x c++ -include dev/emu.hpp "${main[@]}" -c "$f" -o "$o"
      objs+=("$o")
    done
    g++ "${objs[@]}" -o "$out/gpu_tests_emu" -lpthread
    if [ $# -eq 0 ]; then
      exec "$out/gpu_tests_emu" -d yes
    fi
    rc=0
    for f in "$@"; do "$out/gpu_tests_emu" "$f" -d yes || rc=1; done
    exit $rc
    ;;
  lab)
    g++ "${flags[@]}" -x c++ -include dev/emu.hpp -DGEMMA4_T4_EMU_MAIN dev/flash_attention.cu -o "$out/lab_flash_attention_emu" -lpthread
    exec "$out/lab_flash_attention_emu" "${1:-1,2,3}"
    ;;
  *)
    echo "usage: $0 tests [CATCH_FILTER...] | suite [CATCH_FILTER...] | lab [VERSIONS]" >&2
    exit 2
    ;;
esac
