#!/usr/bin/env bash
# The server's two measurements of issue 18 on the GPU machine, for bench/RESULTS.md:
#   1. bench_serve (HTTP, streaming clients) against the in-process bench at the same cells (prompts 512 and
#      4096, concurrency 8, 128 tokens, 3 repeats): the HTTP + JSON cost in total tok/s and in TTFT;
#      then the whole serve sweep (concurrency 1, 8, 16, 64);
#   2. prefix reuse: TTFT of the second request sharing a 2,000-token system prompt against the first's.
#
#   bash bench/serve_h200.sh                     outputs in $OUT (default /tmp/serve_out)
#
# Environment: CKPT (default /tmp/e2b-w4a16: written by tools/make_synthetic when missing), ARCH (nvcc
# -gencode, default arch=compute_90,code=sm_90), IMPL (a built gemma4_t4::impl archive to link instead of
# compiling src/impl.cu again), SERVE_SWEEP (the cells' bench arguments, default --prompts 512,4096 --tokens 128
# --repeats 3), SERVE_CONC (the sweep's concurrencies, default 1,8,16,64; "none": no sweep), SERVER_VARIANTS
# ('|'-separated server flag sets for the c=8 comparison; default "--log-steps|--log-steps --prefill-priority": the
# default schedule and bench's, each step logged to server.log; empty: one server, no flags), PORT (8080),
# CPU=1 (no GPU: the tiny model on the CPU backend, a dry run of this script).
#
# The GPU machine has no package manager: cpp-httplib comes as Debian's packages, downloaded on the dev machine
# into .deps/debs (carry .deps) and unpacked here with dpkg -x, as the device README does for other packages:
#   mkdir -p .deps/debs && (cd .deps/debs && apt-get download libcpp-httplib-dev libcpp-httplib0.11 libssl-dev \
#     libssl3 zlib1g-dev libbrotli-dev libbrotli1)
#   tools/gpu_deps.sh                                         (nlohmann/json into .deps/usr/include)
# The tokenizer is the tiny one (examples/tiny): the synthetic checkpoint has none, and the numbers do not
# depend on the text (bench_serve sends token ids; the prefix test's system prompt is ~2,000 of its tokens).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/serve_out}
B=${BUILD:-/tmp/serve_build}
H=$B/httplib-root
PORT=${PORT:-8080}
mkdir -p "$OUT" "$B" "$H"
log() { printf '\n==== %s ====\n' "$*" | tee -a "$OUT/serve.log"; }

# ---- cpp-httplib from the carried Debian packages ----
if compgen -G ".deps/debs/*.deb" >/dev/null; then
  [[ -f $H/usr/include/httplib.h ]] || for d in .deps/debs/*.deb; do dpkg -x "$d" "$H" || exit 1; done
elif [[ -f /usr/include/httplib.h ]]; then
  H=/  # installed (a Debian machine with libcpp-httplib-dev)
else
  echo "no cpp-httplib: carry .deps/debs (see the top of this script)"
  exit 1
fi
MULTI=usr/lib/x86_64-linux-gnu
HTTPLIB=(-I"$H/usr/include" -I"$H/usr/include/x86_64-linux-gnu" -DCPPHTTPLIB_OPENSSL_SUPPORT -DCPPHTTPLIB_ZLIB_SUPPORT
  -DCPPHTTPLIB_BROTLI_SUPPORT)
HTTPLIB_LINK=(-L"$H/$MULTI" -Wl,-rpath-link,"$H/$MULTI" -Wl,-rpath,"$H/$MULTI" -lcpp-httplib)
export LD_LIBRARY_PATH="$H/$MULTI:${LD_LIBRARY_PATH:-}"

# ---- build: the implementation once, then bench, server, bench_serve, make_synthetic ----
log "build"
INC=(-Iinclude -I. -I.deps/usr/include -I.deps -Iexamples)
DEFS=(-DGEMMA4_T4_DEFAULT_MODEL="\"$ROOT/tests/fixtures/mm_bf16\""
  -DGEMMA4_T4_DEFAULT_TOKENIZER="\"$ROOT/examples/tiny/tokenizer.json\"")
if [[ ${CPU:-0} == 1 ]]; then
  g++ -std=c++17 -O2 -DGEMMA4_T4_NO_CUDA "${INC[@]}" -c src/impl.cpp -o "$B/impl.o" || exit 1
  RT=(-pthread)
elif [[ -n ${IMPL:-} ]]; then  # a ready-made gemma4_t4::impl (e.g. build-gpu-native/libgemma4_t4_impl.a)
  cp "$IMPL" "$B/impl.o" || exit 1
  RT=(-L/usr/local/cuda/lib64 -lcudart -lcublas -pthread)
else
  nvcc -std=c++17 -O2 -gencode "${ARCH:-arch=compute_90,code=sm_90}" "${INC[@]}" -x cu -c src/impl.cu \
    -o "$B/impl.o" || exit 1
  RT=(-L/usr/local/cuda/lib64 -lcudart -lcublas -pthread)
fi
pids=()  # the four programs at once
g++ -std=c++17 -O2 "${INC[@]}" "${DEFS[@]}" bench/bench.cpp "$B/impl.o" "${RT[@]}" -o "$B/bench" &
pids+=($!)
for p in examples/server.cpp bench/bench_serve.cpp; do
  g++ -std=c++17 -O2 "${INC[@]}" "${DEFS[@]}" "${HTTPLIB[@]}" "$p" "$B/impl.o" "${HTTPLIB_LINK[@]}" "${RT[@]}" \
    -o "$B/$(basename "$p" .cpp)" &
  pids+=($!)
done
g++ -std=c++17 -O2 -I.deps/usr/include -I.deps -pthread tools/make_synthetic.cpp -o "$B/make_synthetic" &
pids+=($!)
for pid in "${pids[@]}"; do wait "$pid" || exit 1; done

# ---- the checkpoint ----
if [[ ${CPU:-0} == 1 ]]; then
  MODEL=(--cpu)
  BENCH_MODEL=(--cpu)
  SWEEP=(--prompts 512 --tokens 32 --repeats 1)
else
  CKPT=${CKPT:-/tmp/e2b-w4a16}
  if [[ ! -f $CKPT/config.json ]]; then
    log "make_synthetic e2b w4a16 -> $CKPT"
    "$B/make_synthetic" --model e2b --format w4a16 --out "$CKPT" || exit 1
  fi
  MODEL=(--model "$CKPT" --tokenizer examples/tiny/tokenizer.json)
  BENCH_MODEL=(--model "$CKPT")
  read -r -a SWEEP <<<"${SERVE_SWEEP:---prompts 512,4096 --tokens 128 --repeats 3}"
fi

# ---- 1a. in-process bench at c=8 (no server running) ----
log "bench (in process), concurrency 8"
"$B/bench" "${BENCH_MODEL[@]}" "${SWEEP[@]}" --concurrency 8 --json "$OUT/bench-c8.json" \
  --csv "$OUT/bench-c8.csv" 2>&1 | tee -a "$OUT/serve.log"

# ---- the server ----
start_server() {
  echo "==== server $*" >>"$OUT/server.log"
  "$B/server" "${MODEL[@]}" --port "$PORT" --parallel 64 --max-queue 64 "$@" >"$OUT/server.stdout" \
    2>>"$OUT/server.log" &
  SERVER=$!
  for _ in $(seq 600); do
    grep -q "listening on" "$OUT/server.stdout" 2>/dev/null && return 0
    kill -0 "$SERVER" 2>/dev/null || { echo "server exited; see $OUT/server.log"; exit 1; }
    sleep 0.5
  done
  echo "server did not start in 300 s"
  exit 1
}
stop_server() {
  kill -TERM "$SERVER"
  wait "$SERVER"
  echo "server exit status $?" | tee -a "$OUT/serve.log"
}

# ---- 1b. bench_serve at c=8 per server variant (SERVER_VARIANTS: '|'-separated server flags; the first one
#      stays up for the sweep and the prefix test), then the whole sweep ----
IFS='|' read -r -a VARIANTS <<<"${SERVER_VARIANTS---log-steps|--log-steps --prefill-priority}"
[[ ${#VARIANTS[@]} -gt 0 ]] || VARIANTS=("")
for v in $(seq $((${#VARIANTS[@]} - 1)) -1 0); do
  read -r -a FLAGS <<<"${VARIANTS[$v]}"
  start_server "${FLAGS[@]}"
  log "bench_serve, concurrency 8, server flags: ${VARIANTS[$v]:-(defaults)}"
  "$B/bench_serve" --url "http://127.0.0.1:$PORT" "${SWEEP[@]}" --concurrency 8 --json "$OUT/serve-c8-v$v.json" \
    --csv "$OUT/serve-c8-v$v.csv" 2>&1 | tee -a "$OUT/serve.log"
  [[ $v -eq 0 ]] || stop_server
done
cp "$OUT/serve-c8-v0.json" "$OUT/serve-c8.json"
if [[ ${SERVE_CONC:-} != none ]]; then
  log "bench_serve, concurrency ${SERVE_CONC:-1,8,16,64}"
  "$B/bench_serve" --url "http://127.0.0.1:$PORT" "${SWEEP[@]}" --concurrency "${SERVE_CONC:-1,8,16,64}" \
    --json "$OUT/serve-sweep.json" --csv "$OUT/serve-sweep.csv" 2>&1 | tee -a "$OUT/serve.log"
fi
# ---- 2. prefix reuse: 2,000-token system prompt ----
log "prefix reuse"
python3 bench/serve_prefix_ttft.py --url "http://127.0.0.1:$PORT" --system-tokens 2000 --repeats 5 \
  --json "$OUT/prefix.json" 2>&1 | tee -a "$OUT/serve.log"
curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics.txt" 2>/dev/null ||
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" \
    >"$OUT/metrics.txt"
stop_server

# ---- the comparison ----
log "HTTP + JSON cost at concurrency 8 (targets: <= 5% of total tok/s, <= 2 ms of TTFT)"
for v in $(seq 0 $((${#VARIANTS[@]} - 1))); do
echo "server flags: ${VARIANTS[$v]:-(defaults)}" | tee -a "$OUT/serve.log"
python3 - "$OUT/bench-c8.json" "$OUT/serve-c8-v$v.json" <<'EOF' | tee -a "$OUT/serve.log"
import json, sys
bench = {c["prompt"]: c for c in json.load(open(sys.argv[1]))["cells"]}
serve = {c["prompt"]: c for c in json.load(open(sys.argv[2]))["cells"]}
for p in sorted(serve):
    b, s = bench.get(p), serve[p]
    if not b or b["error"] or s["error"]:
        print(f"prompt {p}: missing or failed cell"); continue
    print(f"prompt {p}: total tok/s bench {b['tok_s_total']:.1f}, serve {s['tok_s_total']:.1f} "
          f"({100 * (s['tok_s_total'] / b['tok_s_total'] - 1):+.1f}%); TTFT p50 bench {b['ttft_ms_median']:.1f} ms, "
          f"serve {s['ttft_ms_median']:.1f} ms ({s['ttft_ms_median'] - b['ttft_ms_median']:+.1f} ms); "
          f"serve TPOT {s['tpot_ms']:.2f} ms, wall {s['tok_s_wall']:.1f} tok/s")
EOF
done
echo "outputs: $OUT"
