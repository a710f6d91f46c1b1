#!/usr/bin/env bash
# The GPU machine's one script: build through CMake (CMakePresets.json: gpu-native, gpu-turing = compute_75
# PTX only), run the GPU suite (ctest -L gpu) in both, then the measurements; every log under $OUT, packed at
# the end into $OUT/results.tgz (beside $OUT/summary.txt).
#
#   tools/gpu_check.sh STEP...      steps, in order:
#     build     configure + build both presets (in parallel)
#     suite     ctest -L gpu in both builds (SUITE_SPEC, a Catch2 test spec: only those cases of the GPU test binary,
#               both builds at once, no fault tests -- a short call's check of the kernels a change touched)
#     ab        quick_bench on full-size synthetic E2B (AB_FORMATS, default w4a16; tools/make_synthetic): this tree's decode variants
#               (AB_DECODE: quick_bench argument sets separated by '|', default the per-kernel and the persistent
#               path) and each earlier tree of AB_TREES (default tmp_base; each a directory holding `git archive REV
#               include kernels src bench | tar -x -C DIR`) -- same lease, same checkpoint (AB_RUNS rounds, default
#               2; AB_TOKENS decode steps each, default 64); then TTFT of a 4096-token prompt, this tree and each of
#               AB_TREES, per checkpoint of AB_TTFT (default w4a16; set but empty: none)
#     bench     the bench sweep of both checkpoints in both builds -> $OUT/<checkpoint>-<build>.json
#               (bench/results/h200-latest/ keeps the latest)
#     decode    quick_bench of the decode paths (per-kernel, persistent and its tunings) and the persistent step's
#               per-instruction trace (issue 16)
#     buckets   quick_bench past 16 sessions (c = BUCKETS_BATCH, default 16..128), both w4a16 matmuls and fp16,
#               this tree and tmp_base's (dequant only; BUCKETS_BASE_ALL=1: every matmul) (issue 17)
#     lab       every lab_* program of the native build (dev/), default arguments
#     micro     bench/micro_bench of the native build (MICRO_ARGS, e.g. --attention: the batched-attention sweep)
#     serve     the server against the in-process bench, and prefix reuse (bench/serve_h200.sh, issue 18)
#     sanitize  compute-sanitizer memcheck and racecheck over the persistent-decode and kernel tests
#     ptxas     registers / spills / shared memory of every sm_75 kernel
#     ncu       warp stall reasons of the persistent step and of per-kernel GEMVs (ncu sections, c=1)
#     prof      ncu sections (stall reasons, occupancy, throughput) of PROF_K's launches in one quick_bench run
#     sass      per-SASS-instruction warp stalls of one launch of SASS_K (ncu full set, source page as CSV)
#     steps     per-kernel GPU time of decode steps at the GPU's own clocks, caches left warm (ncu, one kernel at a
#               time: no PDL overlap), ~2 steps (quick_bench's NVTX range "decode") per concurrency of STEPS_BATCH
#               (default "1 128"), prompt STEPS_PROMPT (512), w4a16 matmuls PROFILE_MATMULS past 32 rows; summed
#               per kernel name
#     ktrace    per-block timeline of decode steps (kernels/ktrace.cuh; prebuilt/quick_bench_ktrace, tools/prebuild.sh
#               KTRACE=1): per concurrency of KTRACE_BATCH (default "1 8 16 32"), the untraced quick_bench, then the
#               traced one and tools/ktrace.py's split of its last steps into kernel boundaries and kernel work
# Environment: PRESETS (the builds of build and suite, default "gpu-native gpu-turing"), SUITE_SPEC (suite), AB_EXTRA
# (ab), SWEEP (bench arguments),
# FORMATS (the bench step's checkpoints, default "w4a16 bf16"), BENCH_BUILDS (its builds, default "native turing"), JOBS
# (build parallelism, default nproc), DEADLINE (see past_deadline), BUILD_TARGETS (instead of the presets' targets, e.g. "gemma4_t4_gpu_tests
# bench" for a short call).
# A/B without building there: tools/prebuild.sh builds the quick_bench binaries and make_synthetic here (CPU
# machine) into the snapshot; `ab` (and every step that runs quick_bench) takes them where no build exists.
# The machine has no package manager: nlohmann/json and Catch2 come from .deps/ (tools/gpu_deps.sh unpacks
# the Debian packages there on this machine; name .deps in the call's carry list).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 1
# The builds live in /tmp, linked from the tree: a device call that carries the tree (or a snapshot of it) replaces
# everything under it, so builds kept inside would be gone at the next call on the same warm machine; /tmp stays
# (measured 2026-12-05 (d), bench/RESULTS.md). A tree that brings a build folder of its own keeps it.
# Builds made on the CPU machine (tools/prebuild.sh with PRESETS) go back where they were built, and this tree is
# seen at the path they were built from (the suite's fixture paths and ctest's files name it).
unxz_to() {  # unxz_to FILE.xz: to stdout (xz, or Python's lzma where the machine has no xz)
  if command -v xz > /dev/null; then xz -dc "$1"; else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"; fi
}
if [ -f prebuilt/builds.tar.xz ]; then
  ln -sfn "$PWD" /tmp/gemma4_t4-src && unxz_to prebuilt/builds.tar.xz | tar -C /tmp -x
fi
for p in gpu-native gpu-turing; do
  [ -e "build-$p" ] || { mkdir -p "/tmp/gemma4_t4-build-$p" && ln -sfn "/tmp/gemma4_t4-build-$p" "build-$p"; }
done
JOBS=${JOBS:-$(nproc)}
DEPS="$PWD/.deps/usr"
MODELS=/tmp/models
PRESETS=${PRESETS:-gpu-native gpu-turing}
fail=0
note() { printf '%s\n' "$*" | tee -a "$OUT/summary.txt"; }
# DEADLINE (seconds since the start, 0: none): steps, and the long steps' runs, that would start later are skipped,
# so that the logs are packed before the device call's limit.
past_deadline() { [ "${DEADLINE:-0}" -gt 0 ] && [ "$SECONDS" -ge "${DEADLINE:-0}" ]; }

# Binaries built on the CPU machine (tools/prebuild.sh: sm_90, libstdc++ linked in) stand in where a step has no
# build of its own: prebuilt/quick_bench and prebuilt/make_synthetic for this tree, TREE/quick_bench for an AB_TREES
# tree. A fresh machine's start and build cost ~300 s of the session's device time; these need none of it.
native_bin() {  # native_bin NAME: this tree's build of NAME, else its prebuilt one
  if [ -x "build-gpu-native/$1" ]; then echo "build-gpu-native/$1"; else echo "prebuilt/$1"; fi
}

synth() {  # synth FORMAT: the full-size synthetic E2B checkpoint in $MODELS/e2b-FORMAT
  [ -d "$MODELS/e2b-$1" ] && return 0
  "$(native_bin make_synthetic)" --model e2b --format "$1" --out "$MODELS/e2b-$1" > "$OUT/synthetic-$1.log" 2>&1
}

step_build() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
  cmake --version | head -1 | tee -a "$OUT/gpu.txt"
  for p in $PRESETS; do
    ( cmake --preset "$p" -DCMAKE_PREFIX_PATH="$DEPS" > "$OUT/configure-$p.log" 2>&1 &&
      cmake --build --preset "$p" -j "$JOBS" ${BUILD_TARGETS:+--target $BUILD_TARGETS} > "$OUT/build-$p.log" 2>&1 ) &
  done
  for t in ${AB_TREES:-tmp_base}; do  # earlier trees' quick_bench, for the A/B (step ab), alongside
    [ -d "$t/include" ] || continue
    [ -x "$t/quick_bench" ] || [ -f "$t/quick_bench.xz" ] && continue  # prebuilt (step_ab unpacks it)
    ( nvcc -std=c++17 -O3 -DNDEBUG -gencode arch=compute_90,code=sm_90 -I"$t/include" -I"$t" -I"$DEPS/include" -x cu \
      -o "/tmp/qb_$t" "$t/bench/quick_bench.cpp" "$t/src/impl.cu" -lcublas > "$OUT/build-$t.log" 2>&1 ||
      note "$t build failed" ) &
  done
  wait
  for p in $PRESETS; do
    if [ -x "build-$p/${BUILT_CHECK:-gemma4_t4_gpu_tests}" ]; then note "built $p"; else
      note "BUILD FAILED: $p"; grep -E "error|Error" "$OUT/configure-$p.log" "$OUT/build-$p.log" | head -30; fail=1; fi
  done
}

failed_cases() {  # failed_cases LOG: the name (and sections) of each Catch2 test case with a failure, once
  awk '/^([0-9]+: )?--------------------+$/ { hdr = !hdr; if (hdr) name = ""; next }
    hdr { sub(/^([0-9]+: )?/, ""); sub(/^ +/, ""); name = name (name == "" ? "" : " / ") $0; next }
    /: FAILED:$/ && name != last { print "  failed: " name; last = name }' "$1"
}

step_suite() {  # both builds at once (one GPU; the suite times nothing), then the fault tests one build at a time
  local t0=$SECONDS
  for p in $PRESETS; do
    # ctest runs the suite as CMakeLists.txt registers it (the fault tests in a process of their own); -V keeps
    # every test's output (the WARN lines with the measured errors). SUITE_SPEC: those cases of the test binary only
    local run=(ctest --test-dir "build-$p" -L gpu -E faults -V)
    [ -z "${SUITE_SPEC:-}" ] || run=("build-$p/gemma4_t4_gpu_tests" "$SUITE_SPEC")
    ( timeout "${SUITE_S:-400}" "${run[@]}" > "$OUT/suite-$p.log" 2>&1
      echo $? > "$OUT/suite-$p.rc" ) &
  done
  wait
  # gpu.faults compares device-wide free memory before and after failed loads: alone on the GPU
  [ -n "${SUITE_SPEC:-}" ] || for p in $PRESETS; do
    timeout "${SUITE_S:-400}" ctest --test-dir "build-$p" -R faults -V >> "$OUT/suite-$p.log" 2>&1
    local rf=$?
    [ "$rf" -eq 0 ] || echo "$rf" > "$OUT/suite-$p.rc"
  done
  for p in $PRESETS; do
    local rc
    rc=$(cat "$OUT/suite-$p.rc")
    note "suite $p ${SUITE_SPEC:+'$SUITE_SPEC' }rc=$rc ($((SECONDS - t0)) s):" \
      "$(grep -E 'All tests passed|test cases' "$OUT/suite-$p.log" | tr '\n' ' ')"
    [ "$rc" -eq 0 ] || { fail=1; failed_cases "$OUT/suite-$p.log" | tee -a "$OUT/summary.txt"
      grep -B2 -A12 -E "FAILED|REQUIRE|CHECK\(" "$OUT/suite-$p.log" | head -60; }
    grep -E "persistent|max rel err" "$OUT/suite-$p.log" | head -24
  done
}

step_ab() {
  local fmt t
  for t in ${AB_TREES:-tmp_base}; do  # prebuilt
    if [ -f "$t/quick_bench.xz" ]; then unxz_to "$t/quick_bench.xz" > "/tmp/qb_$t" && chmod +x "/tmp/qb_$t"
    elif [ -x "$t/quick_bench" ]; then cp "$t/quick_bench" "/tmp/qb_$t"; fi
  done
  for fmt in ${AB_FORMATS:-w4a16}; do
    synth "$fmt" || { note "make_synthetic failed"; return 1; }
    ab_decode "$fmt"
  done
  ab_ttft
}

ab_decode() {  # ab_decode FORMAT: the decode A/B on that checkpoint
  local Q="--model $MODELS/e2b-$1 --prompt 512 --tokens ${AB_TOKENS:-64} --batch ${AB_BATCH:-1,8,16}"
  local abv
  IFS='|' read -r -a abv <<< "${AB_DECODE:---decode kernels|--decode persistent}"
  local t qb
  qb=$(native_bin quick_bench)
  for run in $(seq "${AB_RUNS:-2}"); do
    for d in "${abv[@]}"; do
      note "== $1, this tree, $d (run $run)"
      # shellcheck disable=SC2086
      "$qb" $Q $d 2>&1 | tee -a "$OUT/ab.log" | tail -4 | tee -a "$OUT/summary.txt"
    done
    for t in ${AB_TREES:-tmp_base}; do
      [ -x "/tmp/qb_$t" ] || continue
      note "== $1, $t (run $run)"
      # shellcheck disable=SC2086
      "/tmp/qb_$t" $Q 2>&1 | tee -a "$OUT/ab.log" | tail -3 | tee -a "$OUT/summary.txt"
    done
  done
  if [ "${AB_EXTRA:-1}" = 1 ]; then  # AB_EXTRA=0: no sampled and no Turing-only run
    note "== $1, this tree, sampled (Gemma defaults)"
    "$qb" $Q --sampled 2>&1 | tee -a "$OUT/ab.log" | tail -3 | tee -a "$OUT/summary.txt"
    if [ -x build-gpu-turing/quick_bench ]; then
      note "== $1, Turing-only build"
      build-gpu-turing/quick_bench $Q 2>&1 | tee -a "$OUT/ab.log" | tail -3 | tee -a "$OUT/summary.txt"
    fi
  fi
}

ab_ttft() {
  local T="--prompt 4096 --tokens 4 --batch 1 --ttft 5" fmt t
  for fmt in ${AB_TTFT-w4a16}; do
    synth "$fmt" || continue
    note "== TTFT 4096, $fmt, this tree"
    # shellcheck disable=SC2086
    "$(native_bin quick_bench)" --model "$MODELS/e2b-$fmt" $T 2>&1 | tee -a "$OUT/ab.log" | grep -E "TTFT|median" |
      tee -a "$OUT/summary.txt"
    for t in ${AB_TREES:-tmp_base}; do
      [ -x "/tmp/qb_$t" ] || continue
      note "== TTFT 4096, $fmt, $t"
      # shellcheck disable=SC2086
      "/tmp/qb_$t" --model "$MODELS/e2b-$fmt" $T 2>&1 | tee -a "$OUT/ab.log" | grep -E "TTFT|median" |
        tee -a "$OUT/summary.txt"
    done
  done
}

step_decode() {  # issue 16: per-kernel vs persistent (1 and 2 blocks per SM, L2 prefetch off), then the step traces
  synth w4a16 || { note "make_synthetic failed"; return 1; }
  local Q=("$(native_bin quick_bench)" --model "$MODELS/e2b-w4a16" --prompt 512 --tokens 64)
  local runs=("--decode kernels --batch 1,8,16" "--decode persistent --batch 1,8,16"
    "--decode persistent --persistent-blocks 2 --batch 1,8" "--decode persistent --persistent-prefetch 0 --batch 1,8")
  for r in "${runs[@]}"; do
    note "== quick_bench $r"
    # shellcheck disable=SC2086
    timeout 120 "${Q[@]}" $r 2>&1 | tee -a "$OUT/decode.log" | grep -E "decode path|^ +[0-9]" | tee -a "$OUT/summary.txt"
  done
  for b in 1 8; do
    timeout 120 "${Q[@]}" --tokens 32 --decode persistent --batch $b --persistent-trace "$OUT/trace-c$b.txt" \
      >> "$OUT/decode.log" 2>&1
    cat "$OUT/trace-c$b.txt" >> "$OUT/summary.txt"
  done
  for m in dequant tensorcore; do  # issue 17: passes of more than 16 rows, and prefill
    note "== quick_bench --w4-matmul $m"
    timeout 150 "${Q[@]}" --tokens 32 --batch 16,32,64 --w4-matmul "$m" 2>&1 | tee -a "$OUT/decode.log" |
      grep -E "matmul|^ +[0-9]" | tee -a "$OUT/summary.txt"
    timeout 90 "$(native_bin quick_bench)" --model "$MODELS/e2b-w4a16" --prompt 4096 --tokens 4 --batch 1 --ttft 5 \
      --w4-matmul "$m" 2>&1 | tee -a "$OUT/decode.log" | grep -E "TTFT|median" | tee -a "$OUT/summary.txt"
  done
}

step_buckets() {  # issue 17: decode past 32 sessions (GEMVs to 32 rows, padded graph buckets), against tmp_base
  for fmt in ${FORMATS:-w4a16 bf16}; do synth "$fmt" || { note "make_synthetic failed"; return 1; }; done
  local B=${BUCKETS_BATCH:-16,32,48,64,128}
  for fmt in ${FORMATS:-w4a16 bf16}; do
    local ms=dequant
    [ "$fmt" = w4a16 ] && ms=${BUCKETS_MATMULS:-"dequant tensorcore auto"}
    for m in $ms; do
      past_deadline && { note "buckets: past DEADLINE"; return 0; }
      local Q=(--model "$MODELS/e2b-$fmt" --prompt 512 --tokens 48 --batch "$B" --w4-matmul "$m")
      note "== $fmt --w4-matmul $m: this tree"
      timeout 150 "$(native_bin quick_bench)" "${Q[@]}" 2>&1 | tee -a "$OUT/buckets.log" |
        grep -E "^ +[0-9]|rror" | tee -a "$OUT/summary.txt"
      [ "$fmt" = w4a16 ] && timeout 90 "$(native_bin quick_bench)" --model "$MODELS/e2b-$fmt" --prompt 4096 \
        --tokens 4 --batch 1 --ttft 5 --w4-matmul "$m" 2>&1 | tee -a "$OUT/buckets.log" | grep -E "median" |
        tee -a "$OUT/summary.txt"
      if [ -x /tmp/qb_tmp_base ] && { [ "$m" = dequant ] || [ "${BUCKETS_BASE_ALL:-0}" = 1 ]; }; then
        note "== $fmt --w4-matmul $m: base tree"
        timeout 150 /tmp/qb_tmp_base "${Q[@]}" 2>&1 | tee -a "$OUT/buckets.log" | grep -E "^ +[0-9]|rror" |
          tee -a "$OUT/summary.txt"
      fi
    done
  done
}

step_lab() {  # the kernel lab's programs that exist in this build (dev/README.md); LABS: which (default all),
  # LAB_ARGS: their arguments (default none: each program's defaults)
  for l in build-gpu-native/lab_*; do
    [ -x "$l" ] || continue
    [ -z "${LABS:-}" ] || [[ " $LABS " == *" $(basename "$l") "* ]] || continue
    note "== $l ${LAB_ARGS:-}"
    # shellcheck disable=SC2086
    timeout "${LAB_S:-90}" "$l" ${LAB_ARGS:-} > "$OUT/$(basename "$l").log" 2>&1
    note "rc=$?"
    tail -25 "$OUT/$(basename "$l").log" | tee -a "$OUT/summary.txt"
  done
}

step_micro() {  # bench/micro_bench of the native build (MICRO_ARGS, default --quick; prebuild: LAB_TARGETS=micro_bench)
  local m=build-gpu-native/micro_bench
  [ -x "$m" ] || { note "micro: no $m"; return 1; }
  note "== micro_bench ${MICRO_ARGS:---quick}"
  # shellcheck disable=SC2086
  timeout "${MICRO_S:-240}" "$m" ${MICRO_ARGS:---quick} > "$OUT/micro_bench.log" 2>&1
  note "rc=$?"
  tail -"${MICRO_LINES:-30}" "$OUT/micro_bench.log" | tee -a "$OUT/summary.txt"
}

step_bench() {
  for fmt in ${FORMATS:-w4a16 bf16}; do synth "$fmt" || { note "make_synthetic failed"; return 1; }; done
  local sweep=${SWEEP:-"--prompts 512,4096 --concurrency 1,8,16,32,64,128 --tokens 128 --repeats 1"}
  for fmt in ${FORMATS:-w4a16 bf16}; do
    for b in ${BENCH_BUILDS:-native turing}; do
      past_deadline && { note "bench: past DEADLINE, $fmt $b skipped"; continue; }
      note "== bench E2B $fmt, $b"
      timeout "${SWEEP_S:-300}" "build-gpu-$b/bench" --model "$MODELS/e2b-$fmt" $sweep --quiet \
        --json "$OUT/$fmt-$b.json" 2>&1 | tee -a "$OUT/bench.log" | tail -14
    done
  done
}

step_serve() {  # issue 18's measurements (bench/serve_h200.sh) on the full-size w4a16 checkpoint
  synth w4a16 || { note "make_synthetic failed"; return 1; }
  OUT="$OUT/serve" CKPT="$MODELS/e2b-w4a16" IMPL=build-gpu-native/libgemma4_t4_impl.a \
    timeout "${SERVE_S:-400}" bash bench/serve_h200.sh > "$OUT/serve.log" 2>&1
  note "serve rc=$?"
  grep -A8 "HTTP + JSON cost" "$OUT/serve.log" | tee -a "$OUT/summary.txt"
  grep -iE "ttft|second" "$OUT/serve/serve.log" | tail -4 | tee -a "$OUT/summary.txt"
}

step_ncu() {  # warp stall reasons (instruction fetch among them) of the persistent step and of the per-kernel path
  synth w4a16 || { note "make_synthetic failed"; return 1; }
  local Q=("$(native_bin quick_bench)" --model "$MODELS/e2b-w4a16" --prompt 512 --tokens 8 --batch 1)
  local S=(--section WarpStateStats --section SchedulerStats --section LaunchStats --section SpeedOfLight
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")
  timeout "${NCU_S:-120}" ncu -k regex:decode_step_kernel -s 3 -c 1 "${S[@]}" "${Q[@]}" --decode persistent \
    > "$OUT/ncu-persistent.txt" 2>&1
  note "ncu persistent rc=$?"
  timeout "${NCU_S:-120}" ncu -k regex:gemv_kernel -s 300 -c 8 "${S[@]}" "${Q[@]}" --decode kernels \
    > "$OUT/ncu-kernels.txt" 2>&1
  note "ncu per-kernel rc=$?"
  # one decode step of 32 sessions (past the GEMVs; TensorCore GEMM): time per kernel name, summed. The 32
  # prompts are read first, one 512-row pass each (~550 kernels: ~18,000), so 20,000 skipped kernels land in
  # the decode steps (the lease-1 run of 2026-12-04 skipped 4,200 and caught prefill passes instead)
  timeout "${NCU_S:-120}" ncu --metrics gpu__time_duration.sum -s 20000 -c 450 --print-summary per-kernel \
    "$(native_bin quick_bench)" --model "$MODELS/e2b-w4a16" --prompt 512 --tokens 64 --batch 32 --w4-matmul tensorcore \
    > "$OUT/ncu-c32.txt" 2>&1
  note "ncu c=32 rc=$?"
  awk '/^  [^ ].*\(/{name=$0} /gpu__time_duration.sum/{print $(NF), $(NF-1), name}' "$OUT/ncu-c32.txt" | head -60 |
    tee -a "$OUT/summary.txt"
  for f in persistent kernels; do
    grep -E "Duration|Warp Cycles Per Issued|Registers Per|issue_stalled" "$OUT/ncu-$f.txt" |
      awk '{print $NF, $0}' | sort -g -r | cut -d' ' -f2- | head -40 | tee -a "$OUT/summary.txt"
  done
}

step_prof() {  # ncu sections of the kernels matching PROF_K (regex) in one quick_bench run (PROF_Q: its arguments
  # after --model; PROF_SKIP / PROF_COUNT: matching launches skipped / profiled; PROF_NVTX: below), per-launch lines
  # in the summary
  synth w4a16 || { note "make_synthetic failed"; return 1; }
  local S=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
    --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")
  # PROF_NVTX: only launches inside that NVTX range (e.g. "decode/": quick_bench's timed decode steps)
  [ -n "${PROF_NVTX:-}" ] && S+=(--nvtx --nvtx-include "$PROF_NVTX")
  # shellcheck disable=SC2086
  timeout "${NCU_S:-200}" ncu -k "regex:${PROF_K:-gemm_w4_kernel}" -s "${PROF_SKIP:-0}" -c "${PROF_COUNT:-12}" "${S[@]}" \
    "$(native_bin quick_bench)" --model "$MODELS/e2b-w4a16" ${PROF_Q:---prompt 64 --tokens 8 --batch 1} > "$OUT/prof.txt" 2>&1
  note "ncu prof rc=$?"
  grep -E "^  [a-z_].*\(|Duration|Grid Size|Registers Per|Achieved Occupancy|Memory Throughput|Compute \(SM\) Th|Warp Cycles Per Issued|Issue Slots Busy|issue_stalled_(long_scoreboard|short_scoreboard|barrier|mio_throttle|math_pipe_throttle|wait|not_selected|lg_throttle|tex_throttle|dispatch_stall|no_instruction|imc_miss|membar|drain|selected|sleeping|branch_resolving)" \
    "$OUT/prof.txt" | cut -c1-150 | head -${PROF_LINES:-400} > "$OUT/prof-summary.txt"
  head -c 20000 "$OUT/prof-summary.txt" >> "$OUT/summary.txt"
}

step_sass() {  # where one kernel's warps stall, per SASS instruction: one launch of SASS_K (regex) inside quick_bench's
  # timed decode steps (SASS_Q: its arguments after --model; SASS_SKIP launches skipped), ncu's full set with source
  # counters -> $OUT/sass.ncu-rep, the per-instruction CSV and the details page; the summary keeps the top lines
  synth w4a16 || { note "make_synthetic failed"; return 1; }
  # shellcheck disable=SC2086
  timeout "${NCU_S:-200}" ncu -k "regex:${SASS_K:-gemm_w4x_glu_kernel}" -s "${SASS_SKIP:-3}" -c 1 --set full \
    --nvtx --nvtx-include "decode/" -f -o "$OUT/sass" "$(native_bin quick_bench)" --model "$MODELS/e2b-w4a16" \
    ${SASS_Q:---prompt 64 --tokens 4 --batch 128} > "$OUT/sass-run.txt" 2>&1
  note "ncu sass rc=$?"
  ncu --import "$OUT/sass.ncu-rep" --page details > "$OUT/sass-details.txt" 2>&1
  ncu --import "$OUT/sass.ncu-rep" --page source --csv --print-source sass > "$OUT/sass-source.csv" 2>&1
  grep -E "^  [a-z_].*\(|Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy" \
    "$OUT/sass-details.txt" | cut -c1-150 | tee -a "$OUT/summary.txt"
  python3 - "$OUT/sass-source.csv" << 'PY' | tee -a "$OUT/summary.txt"
import collections, csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head = next((i for i, r in enumerate(rows) if "Source" in r), None)
if head is None:
    sys.exit("sass: no Source column")
h = rows[head]
src, ie = h.index("Source"), h.index("Instructions Executed")
col = next((i for i, c in enumerate(h) if c.startswith("Warp Stall Sampling (All")), None)
if col is None:
    sys.exit("sass: no stall sampling column: " + ", ".join(h))
def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0
body = [r for r in rows[head + 1:] if len(r) > col]
total = sum(num(r[col]) for r in body) or 1
print("sass: %d instructions, %d stall samples; by reason:" % (len(body), total))
reasons = {c: sum(num(r[i]) for r in body) for i, c in enumerate(h) if c.startswith("stall_") and "Not Issued" not in c}
for c, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:10]:
    print("  %-24s %5.1f%%" % (c, 100 * v / total))
mix = collections.Counter()
for r in body:
    op = r[src].split()
    if op:
        mix[(op[1] if op[0].startswith("@") else op[0]).split(".")[0]] += num(r[ie])
executed = sum(mix.values()) or 1
print("sass: %d warp instructions executed; by opcode:" % executed)
print("  " + ", ".join("%s %.1f%%" % (k, 100 * v / executed) for k, v in mix.most_common(16)))
for r in sorted(body, key=lambda r: -num(r[col]))[:30]:
    print("%5.1f%% %9d x  %s" % (100 * num(r[col]) / total, num(r[ie]), r[src][:100]))
PY
}

step_steps() {  # where a decode step's GPU time goes, per kernel name (issues 16, 17)
  synth w4a16 || { note "make_synthetic failed"; return 1; }
  # quick_bench's timed decode steps are the NVTX range "decode": only their kernels are profiled, ~2 steps' worth
  # (STEPS_KERNELS), whatever the prompts (STEPS_PROMPT) cost before them; per concurrency of STEPS_BATCH, per w4a16
  # matmul of PROFILE_MATMULS (past 32 rows)
  local N=(ncu --clock-control none --cache-control none --nvtx --nvtx-include "decode/" --metrics gpu__time_duration.sum
    --print-summary per-kernel)
  for c in ${STEPS_BATCH:-1 128}; do
    for m in $([ "$c" -gt 32 ] && echo "${PROFILE_MATMULS:-auto}" || echo auto); do
      past_deadline && { note "steps: past DEADLINE, c=$c $m skipped"; continue; }
      local f="$OUT/steps-c$c-$m.txt"
      timeout "${NCU_S:-200}" "${N[@]}" -c "${STEPS_KERNELS:-900}" "$(native_bin quick_bench)" \
        --model "$MODELS/e2b-w4a16" --prompt "${STEPS_PROMPT:-512}" --tokens 12 --batch "$c" --w4-matmul "$m" > "$f" 2>&1
      note "ncu steps c=$c prompt ${STEPS_PROMPT:-512} $m rc=$? ($(grep -c 'gpu__time_duration.sum' "$f") kernels)"
      awk '/^  [^ ].*\(/{name=substr($0, 1, 110)} /Invocations/{inv=$NF}
        /gpu__time_duration.sum/{printf "%9.1f us total %5d x %7.2f us  %s\n", inv * $NF, inv, $NF, name}' "$f" |
        sort -g -r | head -30 | tee -a "$OUT/summary.txt"
    done
  done
}

step_ktrace() {
  synth w4a16 || { note "make_synthetic failed"; return 1; }
  [ -x prebuilt/quick_bench_ktrace ] || { [ -f prebuilt/quick_bench_ktrace.xz ] &&
    unxz_to prebuilt/quick_bench_ktrace.xz > prebuilt/quick_bench_ktrace && chmod +x prebuilt/quick_bench_ktrace; }
  [ -x prebuilt/quick_bench_ktrace ] || { note "no prebuilt/quick_bench_ktrace"; return 1; }
  local c Q
  for c in ${KTRACE_BATCH:-1 8 16 32}; do
    Q=(--model "$MODELS/e2b-w4a16" --prompt 512 --tokens "${KTRACE_TOKENS:-48}" --batch "$c")
    note "== c=$c untraced: $("$(native_bin quick_bench)" "${Q[@]}" 2>&1 | tail -2 | head -1)"
    note "== c=$c traced: $(GEMMA4_T4_KTRACE=/tmp/ktrace-c$c.bin prebuilt/quick_bench_ktrace "${Q[@]}" 2>&1 |
      tee "$OUT/ktrace-c$c.log" | grep -E "^ +[0-9]+ +512")"
    python3 tools/ktrace.py /tmp/ktrace-c$c.bin --steps "${KTRACE_STEPS:-8}" > "$OUT/ktrace-c$c.txt" 2>&1
    head -40 "$OUT/ktrace-c$c.txt" | tee -a "$OUT/summary.txt"
  done
}

step_sanitize() {  # SAN_TESTS: the Catch2 test spec (default "[persistent]"); SAN_TOOLS: default "memcheck racecheck"
  local T=build-gpu-native/gemma4_t4_gpu_tests SAN=(env GEMMA4_T4_UNDER_TOOL=1 compute-sanitizer) spec=${SAN_TESTS:-[persistent]}
  for tool in ${SAN_TOOLS:-memcheck racecheck}; do
    timeout "${SAN_S:-240}" "${SAN[@]}" --tool "$tool" --error-exitcode 9 "$T" "$spec" > "$OUT/$tool.log" 2>&1
    note "$tool $spec rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/$tool.log" | tail -1)" \
      "$(grep -E 'test cases' "$OUT/$tool.log" | tail -1)"
  done
}

step_ptxas() {
  nvcc -std=c++17 -O2 -gencode arch=compute_75,code=sm_75 -Iinclude -I. -I"$DEPS/include" -x cu -c src/impl.cu \
    -o /tmp/impl75.o -Xptxas -v > "$OUT/ptxas-sm75.log" 2>&1
  note "ptxas sm_75: max smem $(grep -o '[0-9]* bytes smem' "$OUT/ptxas-sm75.log" | sort -n | tail -1)," \
    "spills: $(grep -c '[1-9][0-9]* bytes spill' "$OUT/ptxas-sm75.log")"
}

for s in "$@"; do
  if past_deadline; then note "---- $s skipped: past DEADLINE ($SECONDS s)"; continue; fi
  note "---- $s ($(date +%T))"
  "step_$s" || fail=1
done
# At most 8 files come back from the GPU machine: everything goes into one archive, summary.txt stays beside it.
( cd "$OUT" && tar czf /tmp/gpu_check.tgz --exclude=results.tgz . && find . -mindepth 1 ! -name summary.txt -delete &&
  mv /tmp/gpu_check.tgz results.tgz )
exit $fail
