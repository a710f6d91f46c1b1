#!/usr/bin/env bash
# Fuzzing campaigns for the libFuzzer harnesses of tests/fuzz (issue 6; tests/fuzz/README.md).
#
#   tools/fuzz_campaign.sh pack BUILD_DIR DEST
#       Copies the built fuzzers (debug sections compressed), their seeds (with seeds/data and the
#       <fuzzer>.options limits), the fixture files they read and this script into DEST (< 60 MiB), and checks
#       that the binaries need only system libraries. DEST then runs on another x86-64 Linux machine with a
#       glibc at least as new as this one's (the versions needed are printed): no cmake, no source tree.
#       BUILD_DIR: a -DGEMMA4_T4_FUZZ=ON build where the fuzz_* and gemma4_t4_fuzz_seeds targets are built.
#
#   DIR/fuzz_campaign.sh run [options] [DIR]
#       Runs every fuzzer of DIR (a packed folder, or BUILD_DIR/tests/fuzz; default: this script's folder)
#       with N parallel workers (libFuzzer -jobs=N -workers=N: N processes sharing one corpus folder), one
#       fuzzer after another, from its seeds and a working corpus. Then sums the executions of all workers
#       (each worker's final stat::number_of_executed_units), counts the findings (crash-*, leak-*, timeout-*,
#       oom-* artifacts) and the corpus, and writes summary.md, the per-worker logs and the artifacts to the
#       output folder.
#         -j N        workers per fuzzer (default: nproc)
#         -t SECONDS  time budget per fuzzer (every worker: -max_total_time)
#         -r RUNS     execution budget per fuzzer, split evenly over the workers (every worker: -runs)
#                     (-t and -r together: whichever ends first; neither: -t 60)
#         -f 'A B'    the fuzzers to run (default: every fuzz_* executable of DIR)
#         -o OUTDIR   results (default: $OUT when set, else ./fuzz-campaign-<UTC time>)
#         -c CORPORA  working corpora, one folder per fuzzer (default: OUTDIR/corpus; pass an earlier
#                     campaign's to continue it)
#         -- ARGS     further libFuzzer flags for every worker (they come last, so they win)
#       Ctrl-C stops the running fuzzer (its workers print their final stats) and still writes the summary.
#       Exit status: 0 nothing found; 1 a finding, a worker that failed, or Ctrl-C; 2 bad usage.
#       Reproduce a finding with the same binary: ./fuzz_<name> OUTDIR/artifacts/fuzz_<name>/crash-<sha1>
#       (set GEMMA4_T4_FIXTURES=DIR/fixtures GEMMA4_T4_FUZZ_DATA=DIR/seeds/data as this script does).
#
# Example: 10 million executions per fuzzer on a 16-core machine:
#   tools/fuzz_campaign.sh pack build-fuzz /tmp/g4fuzz             # here; copy /tmp/g4fuzz over
#   /tmp/g4fuzz/fuzz_campaign.sh run -j 16 -r 10000000 -o /tmp/g4fuzz-results
set -euo pipefail

FUZZERS=(fuzz_safetensors fuzz_config fuzz_tokenizer fuzz_chat fuzz_w4a16)
PACK_LIMIT=$((60 * 1024 * 1024))

die() {
  echo "fuzz_campaign.sh: $*" >&2
  exit 2
}
usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# ---- pack ----

pack() {
  (($# == 2)) || usage
  local build=$1 dest=$2 src repo
  if [[ -x $build/tests/fuzz/fuzz_config ]]; then src=$build/tests/fuzz; else src=$build; fi
  for f in "${FUZZERS[@]}"; do
    [[ -x $src/$f ]] || die "no $src/$f: build it (cmake --build $build --target ${FUZZERS[*]} gemma4_t4_fuzz_seeds)"
  done
  [[ -d $src/seeds/data ]] || die "no $src/seeds/data: build the gemma4_t4_fuzz_seeds target"
  repo=$(sed -n 's/^gemma4_t4_SOURCE_DIR:STATIC=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
  [[ -n $repo ]] || repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  [[ -d $repo/tests/fixtures ]] || die "no fixtures under $repo/tests/fixtures"
  [[ ! -e $dest ]] || [[ -z $(ls -A "$dest") ]] || die "$dest exists and is not empty"

  mkdir -p "$dest/fixtures/flat_keqv" "$dest/fixtures/w4a16"
  for f in "${FUZZERS[@]}"; do  # debug info kept (line numbers in reports), compressed: ~12 MB -> ~8 MB each
    objcopy --compress-debug-sections "$src/$f" "$dest/$f" 2>/dev/null || cp "$src/$f" "$dest/$f"
  done
  cp -r "$src/seeds" "$dest/seeds"
  # What the harnesses read besides their input: fuzz_safetensors links the flat_keqv shards beside the index
  # it writes; fuzz_w4a16 falls back to the w4a16 config without seeds/data.
  cp "$repo"/tests/fixtures/flat_keqv/model-0000[12]-of-00002.safetensors "$dest/fixtures/flat_keqv/"
  cp "$repo/tests/fixtures/w4a16/config.json" "$dest/fixtures/w4a16/"
  cp "${BASH_SOURCE[0]}" "$dest/fuzz_campaign.sh"
  chmod +x "$dest/fuzz_campaign.sh"

  # Only system libraries (the sanitizer and libFuzzer runtimes are linked in statically).
  local libs bad glibc glibcxx
  libs=$(for f in "${FUZZERS[@]}"; do ldd "$dest/$f"; done | awk '{print ($2 == "=>") ? $3 : $1}' | sort -u)
  bad=$(echo "$libs" | grep -Ev '^(linux-vdso\.so\.1|/lib64/|/lib/|/usr/lib/)' || true)
  if echo "$libs" | grep -q 'not'; then bad+=" (a library was not found)"; fi
  [[ -z $bad ]] || die "non-system libraries in the fuzzers: $bad"
  glibc=$(objdump -T "$dest/${FUZZERS[0]}" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)
  glibcxx=$(objdump -T "$dest/${FUZZERS[0]}" | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -n 1)

  local commit
  commit=$(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)
  cat >"$dest/README.md" <<EOF
# gemma4_t4 fuzzers, packed $(date -u +%Y-%m-%d) from ${commit}

Built by $(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || echo "?") on $(uname -srm).
Needs x86-64 Linux with ${glibc} and ${glibcxx} (libstdc++) or newer; libraries: $(echo "$libs" | xargs -n1 basename | xargs).

    ./fuzz_campaign.sh run -j \$(nproc) -r 10000000 -o results     # 10M executions per fuzzer
    ./fuzz_campaign.sh run -j 4 -t 600 -f 'fuzz_w4a16'              # 10 minutes of one fuzzer

results/summary.md is the table; results/logs/<fuzzer>/fuzz-<i>.log the workers' logs; results/artifacts the
findings. Details: the comment at the top of fuzz_campaign.sh, and tests/fuzz/README.md in the repository.
EOF
  local size
  size=$(du -sb "$dest" | cut -f1)
  echo "packed $dest: $(du -sh "$dest" | cut -f1) ($size bytes); needs $glibc, $glibcxx"
  echo "libraries: $(echo "$libs" | xargs)"
  ((size < PACK_LIMIT)) || die "$dest is $size bytes, above the 60 MiB limit"
}

# ---- run ----

# The last value of a "key: N" line in a log, or empty.
stat_of() { sed -n "s/^$1: *\([0-9]*\).*/\1/p" "$2" | tail -n 1; }

run() {
  local workers time_s="" runs="" outdir="${OUT:-}" corpora="" dir="" extra=()
  local -a fuzzers=()
  workers=$(nproc)
  while (($#)); do
    case $1 in
      -j) workers=$2; shift 2 ;;
      -t) time_s=$2; shift 2 ;;
      -r) runs=$2; shift 2 ;;
      -f) read -r -a fuzzers <<<"$2"; shift 2 ;;
      -o) outdir=$2; shift 2 ;;
      -c) corpora=$2; shift 2 ;;
      --) shift; extra=("$@"); break ;;
      -h | --help) usage ;;
      -*) die "unknown option $1" ;;
      *) [[ -z $dir ]] || die "one DIR only"; dir=$1; shift ;;
    esac
  done
  [[ -n $dir ]] || dir=$(dirname "${BASH_SOURCE[0]}")
  dir=$(cd "$dir" && pwd)
  [[ $workers =~ ^[1-9][0-9]*$ ]] || die "-j needs a positive number"
  [[ -z $time_s || $time_s =~ ^[1-9][0-9]*$ ]] || die "-t needs a positive number of seconds"
  [[ -z $runs || $runs =~ ^[1-9][0-9]*$ ]] || die "-r needs a positive number of runs"
  [[ -n $time_s || -n $runs ]] || time_s=60
  if ((${#fuzzers[@]} == 0)); then
    for f in "${FUZZERS[@]}"; do [[ -x $dir/$f ]] && fuzzers+=("$f"); done
  fi
  ((${#fuzzers[@]})) || die "no fuzz_* executables in $dir"
  [[ -n $outdir ]] || outdir=./fuzz-campaign-$(date -u +%Y%m%dT%H%M%SZ)
  mkdir -p "$outdir"
  outdir=$(cd "$outdir" && pwd)
  [[ -n $corpora ]] || corpora=$outdir/corpus
  mkdir -p "$corpora"
  corpora=$(cd "$corpora" && pwd)

  # The files beside the inputs: a packed folder has them; a build tree uses the paths built in.
  if [[ -d $dir/fixtures ]]; then export GEMMA4_T4_FIXTURES=$dir/fixtures; fi
  if [[ -d $dir/seeds/data ]]; then export GEMMA4_T4_FUZZ_DATA=$dir/seeds/data; fi

  local budget=""
  [[ -z $time_s ]] || budget="${time_s} s"
  [[ -z $runs ]] || budget="${budget:+$budget or }$runs runs"
  local summary=$outdir/summary.md
  {
    echo "# Fuzzing campaign $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Host $(hostname): $(nproc) cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1))," \
      "$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); load before: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "Fuzzers from $dir; $workers workers per fuzzer (-jobs=$workers -workers=$workers), budget per fuzzer:" \
      "$budget; per input -timeout=10, -rss_limit_mb=2048; -max_len from seeds/<fuzzer>.options;" \
      "extra flags: ${extra[*]:-none}. Executions: the sum of the workers' stat::number_of_executed_units."
    echo
    echo "| fuzzer | workers | wall s | executions | exec/s | cov / ft | corpus files / bytes | crash | leak | timeout | oom | slow | peak RSS MB | status |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  } >"$summary"

  # Ctrl-C stops the running fuzzer (its workers print their final stats), then the summary is written.
  local failed=0 interrupted=0 f
  trap 'interrupted=1' INT
  for f in "${fuzzers[@]}"; do
    [[ -x $dir/$f ]] || die "no executable $dir/$f"
    local logs=$outdir/logs/$f art=$outdir/artifacts/$f corpus=$corpora/$f max_len=""
    mkdir -p "$logs" "$art" "$corpus"
    rm -f "$logs"/fuzz-*.log
    if [[ -f $dir/seeds/$f.options ]]; then
      max_len=$(sed -n 's/^max_len *= *\([0-9]*\).*/\1/p' "$dir/seeds/$f.options")
    fi
    local -a args=("$corpus")
    [[ ! -d $dir/seeds/$f ]] || args+=("$dir/seeds/$f")
    args+=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "-artifact_prefix=$art/"
      "-jobs=$workers" "-workers=$workers")
    [[ -z $max_len ]] || args+=("-max_len=$max_len")
    [[ -z $time_s ]] || args+=("-max_total_time=$time_s")
    [[ -z $runs ]] || args+=("-runs=$(((runs + workers - 1) / workers))")
    args+=("${extra[@]}")
    echo "== $f: $workers workers, ${budget}; logs in $logs"
    local start end rc=0
    start=$(date +%s)
    (cd "$logs" && "$dir/$f" "${args[@]}" >"$logs/main.log" 2>&1) || rc=$?
    end=$(date +%s)

    local execs=0 cov=0 ft=0 rss=0 n_logs=0 missing=0 log e c
    for log in "$logs"/fuzz-*.log; do
      [[ -f $log ]] || continue
      n_logs=$((n_logs + 1))
      e=$(stat_of stat::number_of_executed_units "$log")
      if [[ -z $e ]]; then  # killed before its final stats: its last status line
        e=$(sed -n 's/^#\([0-9]*\)[[:space:]].*/\1/p' "$log" | tail -n 1)
        missing=$((missing + 1))
      fi
      execs=$((execs + ${e:-0}))
      c=$(sed -n 's/.* cov: \([0-9]*\) ft: \([0-9]*\).*/\1 \2/p' "$log" | tail -n 1)
      if [[ -n $c ]]; then
        ((${c% *} > cov)) && cov=${c% *}
        ((${c#* } > ft)) && ft=${c#* }
      fi
      e=$(stat_of stat::peak_rss_mb "$log")
      ((${e:-0} > rss)) && rss=${e:-0}
    done
    local wall=$((end - start)) crash leak timeout oom slow files bytes status
    ((wall > 0)) || wall=1
    crash=$(find "$art" -maxdepth 1 -name 'crash-*' | wc -l)
    leak=$(find "$art" -maxdepth 1 -name 'leak-*' | wc -l)
    timeout=$(find "$art" -maxdepth 1 -name 'timeout-*' | wc -l)
    oom=$(find "$art" -maxdepth 1 -name 'oom-*' | wc -l)
    slow=$(find "$art" -maxdepth 1 -name 'slow-unit-*' | wc -l)
    files=$(find "$corpus" -type f | wc -l)
    bytes=$(find "$corpus" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
    status=ok
    if ((crash + leak + timeout + oom > 0)); then
      status=FINDINGS
    elif ((interrupted)); then
      status=interrupted
    elif ((rc != 0 || n_logs == 0)); then
      status="FAILED (exit $rc; see logs/$f/main.log)"
    fi
    ((missing == 0)) || status+=" ($missing workers without final stats)"
    [[ $status == ok* ]] || failed=1
    # shellcheck disable=SC2016 # the backquotes are markdown
    printf '| `%s` | %d | %d | %d | %d | %d / %d | %d / %d | %d | %d | %d | %d | %d | %d | %s |\n' "$f" "$workers" \
      "$wall" "$execs" $((execs / wall)) "$cov" "$ft" "$files" "$bytes" "$crash" "$leak" "$timeout" "$oom" "$slow" \
      "$rss" "$status" >>"$summary"
    echo "   $execs executions in $wall s ($((execs / wall))/s), corpus $files files, findings: crash $crash leak $leak" \
      "timeout $timeout oom $oom; $status"
    # The index fuzzer's /dev/shm folder of a worker that died without cleaning up (named by its pid).
    for e in /dev/shm/gemma4_t4_fuzz_index_*; do
      [[ -d $e && ! -e /proc/${e##*_} ]] && rm -rf "$e"
    done
    ((interrupted == 0)) || break
  done
  trap - INT
  {
    echo
    echo "Load after: $(cut -d' ' -f1-3 /proc/loadavg). Logs: logs/<fuzzer>/fuzz-<worker>.log;" \
      "findings: artifacts/<fuzzer>/ (reproduce: ./<fuzzer> <file>)."
  } >>"$summary"
  echo
  cat "$summary"
  return $failed
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) usage ;;
esac
