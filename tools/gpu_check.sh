#!/usr/bin/env bash
# The one script for the GPU machine: builds the GPU suite twice -- native (sm_90 on the H200) and
# Turing-only (compute_75 PTX, JIT-compiled by the driver, so the sm_75 code path is what runs) -- runs both,
# runs the suite under compute-sanitizer memcheck and the attention kernels under racecheck, records ptxas
# resource usage of the sm_75 build, and writes every log under $OUT.
#
#   bash tools/gpu_check.sh [quick]      # quick: native build + run only
#
# Needs nvcc and a GPU; header dependencies (Catch2 v2, nlohmann/json) are taken from .deps/ (copied there
# from this machine's Debian packages: `mkdir -p .deps && cp -r /usr/include/catch2 /usr/include/nlohmann
# .deps/`) because the GPU machine has no package manager access.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
MODE=${1:-full}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
INC="-Iinclude -I.deps -Itests"
DEFS="-DGEMMA4_T4_FIXTURES=\"$ROOT/tests/fixtures\""
NVFLAGS="-std=c++17 -O2 -Xcompiler -Wall,-Wextra"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
nvcc --version | tail -2 | tee -a "$OUT/gpu.txt"

build() {  # build <name> <gencode flags...>
  local name=$1; shift
  local dir="build-gpu-$name"
  mkdir -p "$dir"
  local srcs=(src/impl.cu tests/gpu/*.cpp)
  [ -z "${SKIP_CU:-}" ] && compgen -G "tests/gpu/*.cu" >/dev/null && srcs+=(tests/gpu/*.cu)
  local objs=() pids=()
  for s in "${srcs[@]}"; do
    local o="$dir/$(basename "$s").o"
    objs+=("$o")
    nvcc $NVFLAGS "$@" $INC $DEFS -x cu -c "$s" -o "$o" -Xptxas -v >"$o.log" 2>&1 &
    pids+=($!)
  done
  local ok=0
  for p in "${pids[@]}"; do wait "$p" || ok=1; done
  cat "$dir"/*.log > "$OUT/build-$name.log"
  if [ $ok -ne 0 ]; then echo "BUILD FAILED ($name)"; grep -E "error" "$OUT/build-$name.log" | head -40; return 1; fi
  nvcc "$@" -o "$dir/gpu_tests" "${objs[@]}" -lcublas 2>>"$OUT/build-$name.log" || { echo "LINK FAILED ($name)"; return 1; }
  grep -E "warning" "$OUT/build-$name.log" | grep -v "ptxas info" | head -20
  echo "built $name"
}

run() {  # run <name> [args]
  local name=$1; shift
  local t0=$(date +%s)
  ./build-gpu-$name/gpu_tests "$@" > "$OUT/run-$name.log" 2>&1
  local rc=$?
  echo "run $name rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -3 "$OUT/run-$name.log" | tr '\n' ' ')"
  return $rc
}

fail=0
build native -gencode arch=compute_90,code=sm_90 || fail=1
[ $fail -eq 0 ] && { run native || fail=1; }
if [ "$MODE" = full ]; then
  build turing -gencode arch=compute_75,code=compute_75 || fail=1
  [ -x build-gpu-turing/gpu_tests ] && { CUDA_FORCE_PTX_JIT=1 run turing || fail=1; }
  # sm_75 resource usage (registers, spills, shared memory) of the shipped kernels
  nvcc $NVFLAGS -gencode arch=compute_75,code=sm_75 $INC -x cu -c src/impl.cu -o /tmp/impl75.o -Xptxas -v \
    > "$OUT/ptxas-sm75.log" 2>&1 && echo "ptxas sm_75: max smem $(grep -o '[0-9]* bytes smem' "$OUT/ptxas-sm75.log" | sort -n | tail -1), spills: $(grep -c '[1-9][0-9]* bytes spill' "$OUT/ptxas-sm75.log")"
  if command -v compute-sanitizer >/dev/null; then
    compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 ./build-gpu-native/gpu_tests \
      > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
    compute-sanitizer --tool racecheck --error-exitcode 9 ./build-gpu-native/gpu_tests "*ttention*" \
      > "$OUT/racecheck.log" 2>&1; echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
  fi
fi
exit $fail
