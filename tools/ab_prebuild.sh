#!/usr/bin/env bash
# Builds on this (CPU) machine what tools/gpu_check.sh's `ab` step runs, so that a device call builds nothing: a
# fresh device machine's start and CMake build cost ~300 s of the session's 1,800 s of device time, a call that
# only measures ~40 s (bench/RESULTS.md 2026-12-05 (d)).
#
#   tools/ab_prebuild.sh SNAPSHOT [TREE...]
#
# SNAPSHOT: `git archive` of the tree under test, the directory the device call carries; its prebuilt/quick_bench
# and prebuilt/make_synthetic are built (gpu_check.sh's native_bin takes them where there is no build-gpu-native).
# TREE: a directory under SNAPSHOT holding `git archive REV include kernels src bench` (an AB_TREES tree); its
# quick_bench is built into it (gpu_check.sh copies it to /tmp/qb_TREE). nvcc for sm_$ARCH (default 90: the H100 and
# the H200), libstdc++ and libgcc linked in; the trees build in parallel (~3-5 min each here).
# Then, on the device: cd SNAPSHOT && AB_TREES="TREE..." tools/gpu_check.sh ab
set -euo pipefail
[ $# -ge 1 ] || { sed -n '6,14s/^# \{0,1\}//p' "$0" >&2; exit 2; }
snap=$1
shift
arch=${ARCH:-90}
root=$(cd "$(dirname "$0")/.." && pwd)
inc=()
[ -d "$root/.deps/usr/include" ] && inc=(-I"$root/.deps/usr/include")
static=(-static-libstdc++ -static-libgcc)

quick_bench() {  # quick_bench TREE OUT
  nvcc -std=c++17 -O2 -gencode "arch=compute_$arch,code=sm_$arch" -I"$1/include" -I"$1" "${inc[@]}" -x cu -o "$2" \
    "$1/bench/quick_bench.cpp" "$1/src/impl.cu" -lcublas -Xcompiler "$(IFS=,; echo "${static[*]}")"
}

mkdir -p "$snap/prebuilt"
g++ -std=c++17 -O2 "${inc[@]}" "$snap/tools/make_synthetic.cpp" -o "$snap/prebuilt/make_synthetic" -lpthread \
  "${static[@]}"
pids=()
quick_bench "$snap" "$snap/prebuilt/quick_bench" &
pids+=($!)
for t in "$@"; do
  quick_bench "$snap/$t" "$snap/$t/quick_bench" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
ls -l "$snap/prebuilt" "${@/#/$snap/}" 2>/dev/null | grep -E "quick_bench|make_synthetic" || true
exit $rc
