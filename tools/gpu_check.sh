#!/usr/bin/env bash
# The one script for the GPU machine: builds the GPU suite twice -- native (sm_90 on the H200) and
# Turing-only (compute_75 PTX, JIT-compiled by the driver, so the sm_75 code path is what runs) -- runs both,
# runs the suite under compute-sanitizer memcheck and the attention kernels under racecheck, records ptxas
# resource usage of the sm_75 build, and writes every log under $OUT.
#
#   bash tools/gpu_check.sh [full|quick|bench|final|profile]
#     full: both builds, suite, memcheck + racecheck, benchmarks; quick: native build + suite;
#     bench: benchmarks only (SKIP_MICRO: no kernel micro-benchmarks; SWEEP / SWEEP_TURING / SWEEP_S: the sweep,
#     the Turing-only build's sweep, the time limit per checkpoint and build); final: full less the complete sanitizer runs; profile: ncu per-kernel times
#     (decode and prefill); build: the native suite only; initcheck: the engine tests under initcheck with
#     cuBLAS outputs marked initialised (GEMMA4_T4_SANITIZER_NVTX);
#     verify: both builds of the suite + a short E2B w4a16 decode probe (for a short lease);
#     check: both builds + suite + ptxas, no sanitizers, no benchmarks; sanitize: compute-sanitizer memcheck
#     (+ leak check), racecheck (per kernel family) and initcheck over the native build (built if missing;
#     BUILD_BASE keeps builds between calls on a warm machine; SAN_BUILD=nvtx uses the initcheck mode's build,
#     SKIP_INITCHECK leaves out the unmarked initcheck); every compute-sanitizer run gets GEMMA4_T4_UNDER_TOOL=1
#     (tests/gpu/test_faults.cpp then compares allocation counts, not free GPU memory, which the tool's own
#     device memory moves); micro: kernel micro-benchmarks only
#     (bench/micro_bench.cu; also part of full, bench and verify); perf: the quantized LM head (sweep per
#     head + fidelity), the transformers side by side on the same bf16 checkpoint, and the GPU soak; harden:
#     issue 6's sanitizer set (initcheck probe + engine tests with NVTX marking, memcheck, racecheck families)
#     on one build, then greedy vs sampled decode; ttft: both suites, then TTFT of a 4096-token prompt (PLE on the
#     host / GPU, 2048- / 4096-row passes) and c=1 / c=8 decode of this tree against BASE (default tmp_base/: an
#     earlier tree's include/ kernels/ src/, e.g. `git archive REV include kernels src | tar -x -C tmp_base`),
#     one prefill under ncu, and memcheck of the multi-pass and fault tests.
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

BUILD_BASE=${BUILD_BASE:-$ROOT}
build() {  # build <name> <gencode flags...>
  local name=$1; shift
  local dir="$BUILD_BASE/build-gpu-$name"
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
  "$BUILD_BASE/build-gpu-$name/gpu_tests" "$@" > "$OUT/run-$name.log" 2>&1
  local rc=$?
  echo "run $name rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -3 "$OUT/run-$name.log" | tr '\n' ' ')"
  return $rc
}

# Every compute-sanitizer run: GEMMA4_T4_UNDER_TOOL tells tests/gpu/test_faults.cpp that a tool holds device
# memory of its own (it then compares allocation counts, not free GPU memory).
SAN=(env GEMMA4_T4_UNDER_TOOL=1 compute-sanitizer)

# memcheck + leak check over the whole suite, or the tests named: memcheck_suite BINARY SECONDS [TEST SPEC]
memcheck_suite() {
  timeout "$2" "${SAN[@]}" --tool memcheck --leak-check full --error-exitcode 9 "$1" ${3:+"$3"} > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|LEAK SUMMARY' "$OUT/memcheck.log" | tail -2 | tr '\n' ' ')" \
    "$(grep -E 'All tests|test cases' "$OUT/memcheck.log" | tail -1)"
}

# per-kernel GPU time of the first 4096-token prefill (ncu, clocks locked to base) into $OUT/ncu-prefill.txt:
# ncu_prefill QUICK_BENCH SECONDS LAUNCHES
ncu_prefill() {
  timeout "$2" ncu --metrics gpu__time_duration.sum --launch-count "$3" --print-summary per-kernel \
    "$1" --model /tmp/e2b-w4a16 --prompt 4096 --tokens 1 --batch 1 --no-graphs > "$OUT/ncu-prefill.txt" 2>&1
  echo "ncu prefill rc=$?"
}

# racecheck, one run and log per kernel family: racecheck_families BINARY "PATTERN:SECONDS;PATTERN:SECONDS..."
racecheck_families() {
  local i=0 r races
  IFS=';' read -ra races <<< "$2"
  for r in "${races[@]}"; do
    i=$((i + 1))
    timeout "${r##*:}" "${SAN[@]}" --tool racecheck --error-exitcode 9 "$1" "${r%:*}" > "$OUT/racecheck-$i.log" 2>&1
    echo "racecheck '${r%:*}' rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck-$i.log" | tail -1)" \
      "$(grep -E 'All tests|test cases' "$OUT/racecheck-$i.log" | tail -1)"
  done
}

# initcheck with cuBLAS outputs marked initialised (a GEMMA4_T4_SANITIZER_NVTX build, `--nvtx yes`): the probe
# /tmp/initcheck_cublas without and with the marking (expected: 100 reports, then 0), then the engine test
# files: initcheck_marked BINARY SECONDS
initcheck_marked() {
  local m
  for m in "" --mark; do
    "${SAN[@]}" --tool initcheck --nvtx yes /tmp/initcheck_cublas $m > "$OUT/initcheck-cublas$m.log" 2>&1
    echo "initcheck (cuBLAS probe $m): $(grep -c 'Uninitialized' "$OUT/initcheck-cublas$m.log") reports"
  done
  timeout "$2" "${SAN[@]}" --tool initcheck --nvtx yes --error-exitcode 9 "$1" \
    -# "[#test_cuda_parity],[#test_batch],[#test_faults]" > "$OUT/initcheck-engine.log" 2>&1
  echo "initcheck (engine tests) rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/initcheck-engine.log" | tail -1)" \
    "$(grep -E 'All tests|test cases' "$OUT/initcheck-engine.log" | tail -1)"
}

# The fuzz campaign in the background when FUZZ_DIR names a tools/fuzz_campaign.sh pack: fuzz_start ARGS,
# later fuzz_finish. Corpora and worker logs stay in /tmp/fuzz (too many files for $OUT); the summary and
# any findings are copied to $OUT/fuzz.
fuzz_start() {
  [ -n "${FUZZ_DIR:-}" ] || return 0
  ( bash "$FUZZ_DIR/fuzz_campaign.sh" run "$@" -o /tmp/fuzz "$FUZZ_DIR" > "$OUT/fuzz-campaign.log" 2>&1
    echo "fuzz campaign rc=$?" >> "$OUT/fuzz-campaign.log"
    mkdir -p "$OUT/fuzz" && cp /tmp/fuzz/summary.md "$OUT/fuzz/" 2>/dev/null
    cp -r /tmp/fuzz/artifacts "$OUT/fuzz/" 2>/dev/null ) &
  FUZZ_PID=$!
}
fuzz_finish() {
  [ -n "${FUZZ_PID:-}" ] || return 0
  wait "$FUZZ_PID"
  tail -5 "$OUT/fuzz-campaign.log"
  [ -f "$OUT/fuzz/summary.md" ] && cat "$OUT/fuzz/summary.md"
}

fail=0
if [ "$MODE" = verify ]; then
  # Short lease: both builds of the suite, and in the background the E2B w4a16 decode probe (native).
  ( g++ -std=c++17 -O2 -pthread -I.deps -o /tmp/make_synthetic tools/make_synthetic.cpp &&
    /tmp/make_synthetic --model e2b --format w4a16 --out /tmp/e2b-w4a16 > /dev/null 2>&1 ) &
  nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 $INC -x cu -o /tmp/quick_bench_native bench/quick_bench.cpp \
    src/impl.cu -lcublas > "$OUT/build-bench-native.log" 2>&1 &
  nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 -o /tmp/micro_bench bench/micro_bench.cu -lcublas \
    > "$OUT/build-micro.log" 2>&1 &
  build native -gencode arch=compute_90,code=sm_90 && run native || fail=1
  build turing -gencode arch=compute_75,code=compute_75 && run turing || fail=1
  wait
  /tmp/micro_bench --quick > "$OUT/micro.log" 2>&1 || { echo "micro_bench failed"; fail=1; }
  cat "$OUT/micro.log"
  /tmp/quick_bench_native --model /tmp/e2b-w4a16 --prompt 512 --tokens 48 --batch 1,8,16 2>&1 | tee "$OUT/bench.log"
  exit $fail
fi
if [ "$MODE" = micro ] || [ "$MODE" = full ] || { [ "$MODE" = bench ] && [ -z "${SKIP_MICRO:-}" ]; }; then
  nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 -o /tmp/micro_bench bench/micro_bench.cu -lcublas \
    > "$OUT/build-micro.log" 2>&1 && /tmp/micro_bench > "$OUT/micro.log" 2>&1 || { echo "micro_bench failed"; fail=1; }
  cat "$OUT/micro.log"
  [ "$MODE" = micro ] && exit $fail
fi
if [ "$MODE" = sanitize ]; then
  SB=${SAN_BUILD:-native}  # e.g. nvtx: the initcheck mode's build (the same code plus the NVTX marking)
  [ -x "$BUILD_BASE/build-gpu-$SB/gpu_tests" ] || build $SB -gencode arch=compute_90,code=sm_90 || exit 1
  T="$BUILD_BASE/build-gpu-$SB/gpu_tests"
  fuzz_start ${FUZZ_ARGS:--j 12 -r 10000000 -t 80}  # the host's cores fuzz meanwhile (FUZZ_DIR set)
  memcheck_suite "$T" 220
  racecheck_families "$T" "attention*:70;flash attention: prompt*:70;gemv*,quantized*:70;rmsnorm*,residual_norm*,sample_kernel*:70"
  if [ -z "${SKIP_INITCHECK:-}" ]; then  # without the NVTX marking: cuBLAS outputs are reported (tool limit)
    timeout 150 "${SAN[@]}" --tool initcheck --error-exitcode 9 "$T" > "$OUT/initcheck.log" 2>&1
    echo "initcheck rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/initcheck.log" | tail -1) $(tail -2 "$OUT/initcheck.log" | head -1)"
  fi
  fuzz_finish
  exit 0
fi
if [ "$MODE" = initfuzz ]; then
  # The fuzz campaign on the host's cores (FUZZ_DIR: a tools/fuzz_campaign.sh pack) while initcheck runs on the
  # GPU: the kernel tests (files test_kernels.cu, test_flash_attention.cu) and tools/initcheck_cublas.cu, which
  # shows whether initcheck tracks cuBLAS's stores (the engine tests' reports all follow cuBLAS GEMMs).
  fuzz_start ${FUZZ_ARGS:--j 14 -r 10000000 -t 170}
  if [ -z "${SKIP_CUBLAS_PROBE:-}" ]; then
    nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 -o /tmp/initcheck_cublas tools/initcheck_cublas.cu -lcublas &&
      "${SAN[@]}" --tool initcheck /tmp/initcheck_cublas > "$OUT/initcheck-cublas.log" 2>&1
    echo "initcheck (cuBLAS probe): $(grep -c 'Uninitialized' "$OUT/initcheck-cublas.log") reports; $(grep -E 'ERROR SUMMARY|sum of' "$OUT/initcheck-cublas.log" | tr '\n' ' ')"
  fi
  if [ -z "${SKIP_KERNEL_INITCHECK:-}" ]; then  # needs the suite's build: minutes beside the fuzzers
    [ -x "$BUILD_BASE/build-gpu-native/gpu_tests" ] || build native -gencode arch=compute_90,code=sm_90 || exit 1
    timeout 200 "${SAN[@]}" --tool initcheck --error-exitcode 9 "$BUILD_BASE/build-gpu-native/gpu_tests" -# \
      "[#test_kernels],[#test_flash_attention]" > "$OUT/initcheck-kernels.log" 2>&1
    echo "initcheck (kernel tests) rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/initcheck-kernels.log" | tail -1) $(tail -2 "$OUT/initcheck-kernels.log" | head -1)"
  fi
  fuzz_finish
  exit 0
fi
if [ "$MODE" = initcheck ]; then
  # initcheck over the engine tests with cuBLAS outputs marked initialised (GEMMA4_T4_SANITIZER_NVTX, NVTX
  # memory API, `--nvtx yes`): first the probe without and with the marking (expected: 100 reports, then 0),
  # then the suite's engine test files.
  nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 -o /tmp/initcheck_cublas tools/initcheck_cublas.cu -lcublas &
  build nvtx -gencode arch=compute_90,code=sm_90 -DGEMMA4_T4_SANITIZER_NVTX || exit 1
  wait
  initcheck_marked "$BUILD_BASE/build-gpu-nvtx/gpu_tests" "${INITCHECK_S:-420}"
  exit 0
fi
if [ "$MODE" = harden ]; then
  # Issue 6's sanitizer set in one call on one build (native + GEMMA4_T4_SANITIZER_NVTX, which is the native
  # build plus cuBLAS outputs marked initialised): the initcheck probe without and with the marking, initcheck
  # over the engine tests (--nvtx yes), memcheck + leak check over the whole suite, racecheck per kernel family
  # (RACE: "pattern:seconds;..."), then the sampled decode probe (quick_bench --sampled, c = 1 and 8).
  ( g++ -std=c++17 -O2 -pthread -I.deps -o /tmp/make_synthetic tools/make_synthetic.cpp &&
    /tmp/make_synthetic --model e2b --format w4a16 --out /tmp/e2b-w4a16 > /dev/null 2>&1 ) &
  nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 $INC -x cu -o /tmp/quick_bench_native bench/quick_bench.cpp \
    src/impl.cu -lcublas > "$OUT/build-bench-native.log" 2>&1 &
  nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 -o /tmp/initcheck_cublas tools/initcheck_cublas.cu -lcublas &
  PROBE_PID=$!
  build nvtx -gencode arch=compute_90,code=sm_90 -DGEMMA4_T4_SANITIZER_NVTX || exit 1
  T="$BUILD_BASE/build-gpu-nvtx/gpu_tests"
  wait "$PROBE_PID"
  initcheck_marked "$T" "${INITCHECK_S:-150}"
  memcheck_suite "$T" "${MEMCHECK_S:-170}"
  racecheck_families "$T" "${RACE:-rmsnorm*,residual_norm*,sample_kernel*:80}"
  wait  # the probe's checkpoint and build
  if [ -x /tmp/quick_bench_native ] && [ -d /tmp/e2b-w4a16 ]; then
    echo "== E2B w4a16, native, prompt 512, greedy and sampled on the GPU" | tee -a "$OUT/bench.log"
    for smp in "" --sampled; do
      /tmp/quick_bench_native --model /tmp/e2b-w4a16 --prompt 512 --tokens 64 --batch 1,8 $smp 2>&1 | tee -a "$OUT/bench.log"
    done
  fi
  exit 0
fi
if [ "$MODE" = perf ]; then
  # One run, one GPU: (1) the decode sweep with each LM head storage on the QAT E2B, (2) the quantized heads'
  # logit fidelity against the fp16 head, (3) transformers 5.17 (fp16, static and dynamic cache) next to our
  # bench on the same bf16 E2B, c = 1 and 8, prompt 512, (4) the GPU soak (tests/SOAK.md).
  g++ -std=c++17 -O2 -pthread -I.deps -o /tmp/make_synthetic tools/make_synthetic.cpp || fail=1
  DEF_MODEL="-DGEMMA4_T4_DEFAULT_MODEL=\"$ROOT/tests/fixtures/mm_bf16\""
  nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 $INC $DEF_MODEL -x cu -o /tmp/bench_native bench/bench.cpp \
    src/impl.cu -lcublas > "$OUT/build-bench-native.log" 2>&1 &
  [ -f bench/soak.cpp ] && nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 $INC $DEF_MODEL -x cu -o /tmp/soak \
    bench/soak.cpp src/impl.cu -lcublas > "$OUT/build-soak.log" 2>&1 &
  for fmt in w4a16 bf16; do
    /tmp/make_synthetic --model e2b --format $fmt --out /tmp/e2b-$fmt > "$OUT/synthetic-$fmt.log" 2>&1 || fail=1
  done
  wait
  [ -x /tmp/bench_native ] || { echo "bench build failed"; tail -20 "$OUT/build-bench-native.log"; exit 1; }
  for head in f16 int8 int4; do
    echo "== E2B w4a16, native, LM head $head" | tee -a "$OUT/perf.log"
    /tmp/bench_native --model /tmp/e2b-w4a16 --lm-head $head --prompts 512 --concurrency 1,8 --tokens 128 \
      --repeats 3 --quiet --json "$OUT/bench-head-$head.json" 2>&1 | tee -a "$OUT/perf.log"
  done
  echo "== LM head fidelity (E2B w4a16, 4096 positions)" | tee -a "$OUT/perf.log"
  /tmp/bench_native --model /tmp/e2b-w4a16 --lm-head-fidelity 4096 --quiet --json "$OUT/fidelity.json" 2>&1 |
    tee -a "$OUT/perf.log"
  echo "== side by side, E2B bf16 (as fp16), prompt 512: gemma4_t4" | tee -a "$OUT/perf.log"
  /tmp/bench_native --model /tmp/e2b-bf16 --prompts 512 --concurrency 1,8 --tokens 128 --repeats 3 --quiet \
    --json "$OUT/side-ours.json" 2>&1 | tee -a "$OUT/perf.log"
  echo "== side by side: transformers" | tee -a "$OUT/perf.log"
  timeout 400 python3 tools/hf_side_by_side.py --model /tmp/e2b-bf16 --prompt 512 --tokens 128 --batch 1,8 \
    --cache static,dynamic --budget 60 2>&1 | grep -v Warning | tee -a "$OUT/perf.log"
  if [ -x /tmp/soak ]; then
    echo "== soak (GPU)" | tee -a "$OUT/perf.log"
    timeout 240 /tmp/soak ${SOAK_ARGS:---model /tmp/e2b-w4a16 --backend cuda --max-concurrency 32 --max-context 2048 \
      --max-new-tokens 128 --rss-limit-mib 32 --max-seconds 200} --json "$OUT/soak-gpu.json" \
      > "$OUT/soak-gpu.log" 2>&1; echo "soak rc=$?" | tee -a "$OUT/perf.log"; tail -30 "$OUT/soak-gpu.log"
  fi
  exit $fail
fi
if [ "$MODE" = check ] || [ "$MODE" = ttft ]; then
  # the Turing-only suite, the synthetic E2B and quick_bench, built while the native suite builds and runs
  ( build turing -gencode arch=compute_75,code=compute_75 > "$OUT/build-turing.out" 2>&1 ) &
  TURING_PID=$!
  ( g++ -std=c++17 -O2 -pthread -I.deps -o /tmp/make_synthetic tools/make_synthetic.cpp &&
    /tmp/make_synthetic --model e2b --format w4a16 --out /tmp/e2b-w4a16 > /dev/null 2>&1 ) &
  nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 $INC -x cu -o /tmp/quick_bench_native bench/quick_bench.cpp \
    src/impl.cu -lcublas > "$OUT/build-bench-native.log" 2>&1 &
  BASE=${BASE:-tmp_base}  # ttft: quick_bench on an earlier tree too
  [ "$MODE" = ttft ] && [ -d "$BASE/include" ] && nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 \
    -I"$BASE/include" -x cu -o /tmp/qb_base bench/quick_bench.cpp "$BASE/src/impl.cu" -lcublas \
    > "$OUT/build-qb-base.log" 2>&1 &
fi
if [ "$MODE" = build ]; then  # the native suite only (e.g. in the background while another mode measures)
  build native -gencode arch=compute_90,code=sm_90
  exit $?
fi
if [ "$MODE" != bench ]; then
build native -gencode arch=compute_90,code=sm_90 || fail=1
[ $fail -eq 0 ] && { run native || fail=1; }
fi
if [ "$MODE" = full ] || [ "$MODE" = final ] || [ "$MODE" = check ]; then
  if [ "$MODE" = check ]; then
    wait "$TURING_PID"; cat "$OUT/build-turing.out"
  else
    build turing -gencode arch=compute_75,code=compute_75 || fail=1
  fi
  # compute_75 PTX only: the driver JIT-compiles our kernels (cuBLAS keeps its own SASS)
  [ -x "$BUILD_BASE/build-gpu-turing/gpu_tests" ] && { run turing || fail=1; }
  [ "$MODE" = check ] && wait  # the probe's checkpoint and build
  if [ "$MODE" = check ] && [ -x /tmp/quick_bench_native ] && [ -d /tmp/e2b-w4a16 ]; then
    echo "== E2B w4a16, native, prompt 4096 (quick_bench: TTFT of the second session)" | tee -a "$OUT/bench.log"
    /tmp/quick_bench_native --model /tmp/e2b-w4a16 --prompt 4096 --tokens 16 --batch 1,2 2>&1 | tee -a "$OUT/bench.log"
    for pdl in "" --no-pdl; do  # decode with and without programmatic dependent launch (sm_90 build)
      echo "== E2B w4a16, native, prompt 512 ${pdl:-(PDL on)}" | tee -a "$OUT/bench.log"
      /tmp/quick_bench_native --model /tmp/e2b-w4a16 --prompt 512 --tokens 64 --batch 1,8 $pdl 2>&1 | tee -a "$OUT/bench.log"
    done
    echo "== E2B w4a16, native, prompt 512, sampled on the GPU (top-k 64, top-p 0.95)" | tee -a "$OUT/bench.log"
    /tmp/quick_bench_native --model /tmp/e2b-w4a16 --prompt 512 --tokens 64 --batch 1,8 --sampled 2>&1 | tee -a "$OUT/bench.log"
    if [ -n "${PROFILE:-}" ]; then  # per-kernel time of ~2 eager decode steps (ncu; clocks locked to base)
      timeout 120 ncu --metrics gpu__time_duration.sum --launch-skip 2500 --launch-count 800 --print-summary per-kernel \
        /tmp/quick_bench_native --model /tmp/e2b-w4a16 --prompt 512 --tokens 8 --batch 1 --no-graphs > "$OUT/ncu.txt" 2>&1
      echo "ncu decode rc=$?"
    fi
  fi
  # sm_75 resource usage (registers, spills, shared memory) of the shipped kernels
  nvcc $NVFLAGS -gencode arch=compute_75,code=sm_75 $INC -x cu -c src/impl.cu -o /tmp/impl75.o -Xptxas -v \
    > "$OUT/ptxas-sm75.log" 2>&1 && echo "ptxas sm_75: max smem $(grep -o '[0-9]* bytes smem' "$OUT/ptxas-sm75.log" | sort -n | tail -1), spills: $(grep -c '[1-9][0-9]* bytes spill' "$OUT/ptxas-sm75.log")"
  if [ "$MODE" = final ] && command -v compute-sanitizer >/dev/null; then  # the kernels that changed last
    "${SAN[@]}" --tool memcheck --error-exitcode 9 "$BUILD_BASE/build-gpu-native/gpu_tests" "*gemv*" \
      > "$OUT/memcheck.log" 2>&1; echo "memcheck (gemv) rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  fi
  if [ "$MODE" = full ] && command -v compute-sanitizer >/dev/null; then
    memcheck_suite "$BUILD_BASE/build-gpu-native/gpu_tests" 300
    racecheck_families "$BUILD_BASE/build-gpu-native/gpu_tests" "*ttention*,*gemv*:150"
  fi
fi
if [ "$MODE" = full ] || [ "$MODE" = bench ] || [ "$MODE" = final ]; then
  # Full-size synthetic E2B (tools/make_synthetic.cpp) in both real layouts, measured with the bench CLI
  # (bench/bench.cpp: device report, bandwidth, the T4-study sweep) in the native and the Turing-only builds,
  # plus quick_bench's TTFT of a 4096-token prompt.
  g++ -std=c++17 -O2 -pthread -I.deps -o /tmp/make_synthetic tools/make_synthetic.cpp || fail=1
  DEF_MODEL="-DGEMMA4_T4_DEFAULT_MODEL=\"$ROOT/tests/fixtures/mm_bf16\""
  for arch in native turing; do
    gen="-gencode arch=compute_90,code=sm_90"; [ $arch = turing ] && gen="-gencode arch=compute_75,code=compute_75"
    nvcc $NVFLAGS $gen $INC $DEF_MODEL -x cu -o /tmp/bench_$arch bench/bench.cpp src/impl.cu -lcublas \
      > "$OUT/build-bench-$arch.log" 2>&1 || { echo "bench build failed ($arch)"; fail=1; } &
  done
  nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 $INC -x cu -o /tmp/quick_bench_native bench/quick_bench.cpp \
    src/impl.cu -lcublas > "$OUT/build-quick-bench.log" 2>&1 &
  for fmt in w4a16 bf16; do
    /tmp/make_synthetic --model e2b --format $fmt --out /tmp/e2b-$fmt > "$OUT/synthetic-$fmt.log" 2>&1 || fail=1
  done
  wait
  SWEEP=${SWEEP:-"--prompts 512,4096 --concurrency 1,4,8,16 --tokens 128 --repeats 3"}
  for fmt in w4a16 bf16; do
    for arch in native turing; do
      echo "== E2B $fmt, $arch build" | tee -a "$OUT/bench.log"
      sweep=$SWEEP; [ $arch = turing ] && sweep=${SWEEP_TURING:-$SWEEP}
      timeout ${SWEEP_S:-300} /tmp/bench_$arch --model /tmp/e2b-$fmt $sweep --quiet --json "$OUT/bench-$fmt-$arch.json" \
        --csv "$OUT/bench-$fmt-$arch.csv" --svg "$OUT/bench-$fmt-$arch.svg" 2>&1 | tee -a "$OUT/bench.log"
    done
  done
  echo "== E2B w4a16, native build, sampled decode (Gemma 4's generation_config)" | tee -a "$OUT/bench.log"
  timeout ${SWEEP_S:-300} /tmp/bench_native --model /tmp/e2b-w4a16 --sampling gemma --prompts 512 --concurrency 1,8 \
    --tokens 128 --repeats 3 --quiet --json "$OUT/bench-w4a16-native-sampled.json" 2>&1 | tee -a "$OUT/bench.log"
  echo "== E2B w4a16, native, prompt 4096 (quick_bench: TTFT of the second session)" | tee -a "$OUT/bench.log"
  /tmp/quick_bench_native --model /tmp/e2b-w4a16 --prompt 4096 --tokens 16 --batch 1,2 2>&1 | tee -a "$OUT/bench.log"
fi
if [ "$MODE" = ttft ]; then
  # The native suite (above) and the Turing-only one; then time to first token of a 4096-token prompt, E2B
  # w4a16, one lease: this tree against BASE (a copy of an earlier tree's include/ kernels/ src/ made with git
  # archive, when present), PLE rows on the host or the GPU, passes of 2048 or 4096 rows (quick_bench --ttft:
  # 5 fresh prompts in one session, median); c=1 / c=8 decode of both; then the per-kernel GPU time of one
  # prefill (ncu).
  wait
  cat "$OUT/build-turing.out"
  [ -x "$BUILD_BASE/build-gpu-turing/gpu_tests" ] && { run turing || fail=1; }
  [ -x /tmp/quick_bench_native ] || { echo "BUILD FAILED"; tail -20 "$OUT/build-bench-native.log"; exit 1; }
  Q="--model /tmp/e2b-w4a16 --prompt 4096 --tokens 6 --batch 1 --ttft ${TTFT_RUNS:-5}"
  for bin in /tmp/qb_base /tmp/quick_bench_native; do
    [ -x $bin ] || continue
    for extra in "" "--ple device" "--pass-rows 4096" "--ple device --pass-rows 4096"; do
      echo "== $bin $extra" | tee -a "$OUT/ttft.log"
      $bin $Q $extra 2>&1 | grep -E "TTFT|load|failed" | tee -a "$OUT/ttft.log"
    done
    echo "== $bin decode, prompt 512" | tee -a "$OUT/ttft.log"
    $bin --model /tmp/e2b-w4a16 --prompt 512 --tokens 64 --batch 1,8 2>&1 | tail -3 | tee -a "$OUT/ttft.log"
  done
  ncu_prefill /tmp/quick_bench_native "${PREFILL_NCU_S:-200}" "${PREFILL_LAUNCHES:-1400}"
  grep -E "^  [a-zA-Z_]|gpu__time_duration.sum|Invocations" "$OUT/ncu-prefill.txt" | grep -A1 dequant | head -40
  # the engine tests that run multi-pass prompts and the fault tests
  memcheck_suite "$BUILD_BASE/build-gpu-native/gpu_tests" "${MEMCHECK_S:-150}" "[cpu-vs-cuda],[faults]"
  [ $fail -eq 0 ] && rm -f "$OUT"/build-*.log "$OUT"/build-turing.out  # the transfer brings back a few files only
  exit $fail
fi
if [ "$MODE" = profile ]; then
  # Per-kernel GPU time (ncu) of (1) eager decode steps, E2B w4a16, c=1, prompt 512 -- where a decode step's
  # time goes -- and (2) the first 4096-token prefill (8 passes of 512 rows) -- where TTFT goes. Builds
  # are skipped when a previous call on this warm machine left them.
  [ -x /tmp/make_synthetic ] || g++ -std=c++17 -O2 -pthread -I.deps -o /tmp/make_synthetic tools/make_synthetic.cpp &
  [ -x /tmp/qb ] || nvcc $NVFLAGS -gencode arch=compute_90,code=sm_90 $INC -x cu -o /tmp/qb bench/quick_bench.cpp \
    src/impl.cu -lcublas > "$OUT/build-profile.log" 2>&1 || fail=1
  wait
  [ -d /tmp/e2b-w4a16 ] || /tmp/make_synthetic --model e2b --format w4a16 --out /tmp/e2b-w4a16 > /dev/null 2>&1 || fail=1
  ncu --metrics gpu__time_duration.sum --launch-skip 2500 --launch-count 700 --print-summary per-kernel \
    /tmp/qb --model /tmp/e2b-w4a16 --prompt 512 --tokens 8 --batch 1 --no-graphs > "$OUT/ncu.txt" 2>&1
  grep -E "^  [a-zA-Z_]|gpu__time_duration.sum|Invocations" "$OUT/ncu.txt" | head -150
  ncu_prefill /tmp/qb "${PREFILL_NCU_S:-230}" "${PREFILL_LAUNCHES:-9000}"
  grep -E "^  [a-zA-Z_]|gpu__time_duration.sum|Invocations" "$OUT/ncu-prefill.txt" | head -150
  [ "$MODE" = profile ] && exit $fail
fi
exit $fail
