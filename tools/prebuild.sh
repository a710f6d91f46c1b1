#!/usr/bin/env bash
# Builds on this (CPU) machine what tools/gpu_check.sh runs, so that a device call builds nothing: a fresh device
# machine's start and CMake build of both presets cost ~400 s of the session's 1,800 s of device time, a call that
# only measures ~40 s (bench/RESULTS.md 2026-12-05 (d)).
#
#   tools/prebuild.sh SNAPSHOT [TREE...]
#
# SNAPSHOT: `git archive` of the tree under test, the directory the device call carries.
# PRESETS unset: its prebuilt/quick_bench and prebuilt/make_synthetic are built (gpu_check.sh's native_bin takes
#   them where there is no build-gpu-native).
# PRESETS="gpu-native gpu-turing" (or one of them): those CMake presets' GPU targets (the suite, bench, quick_bench,
#   make_synthetic) are built where the device call keeps them, /tmp/gemma4_t4-build-PRESET, from the snapshot seen
#   as /tmp/gemma4_t4-src (the paths compiled into the suite and written into ctest's files are the device's paths),
#   gpu-native for sm_$ARCH, and packed into SNAPSHOT/prebuilt/builds.tar.xz; gpu_check.sh unpacks it there.
#   LAB_TARGETS (e.g. "lab_gemm_w4"): kernel lab programs built into gpu-native as well, for gpu_check.sh's lab step.
# KTRACE=1 (PRESETS unset): prebuilt/quick_bench_ktrace.xz as well, built with -DGEMMA4_T4_KTRACE (kernels/ktrace.cuh;
#   gpu_check.sh's ktrace step).
# TREE: a directory under SNAPSHOT holding `git archive REV include kernels src bench` (an AB_TREES tree); its
#   quick_bench is built into it, packed as quick_bench.xz (gpu_check.sh unpacks it to /tmp/qb_TREE).
# nvcc for sm_$ARCH (default 90: the H100 and the H200) with CMake's Release flags (-O3 -DNDEBUG: an A/B tree is built
# as the tree under test is; 2026-12-05 (e) measured one at -O2 against a CMake build), libstdc++ and libgcc linked
# in; builds run in parallel
# (here: ~2-5 min a quick_bench, ~8 min both presets).
# Then, on the device: cd SNAPSHOT && AB_TREES="TREE..." tools/gpu_check.sh ab suite ...
set -euo pipefail
[ $# -ge 1 ] || { sed -n '6,22s/^# \{0,1\}//p' "$0" >&2; exit 2; }
snap=$(cd "$1" && pwd)
shift
arch=${ARCH:-90}
root=$(cd "$(dirname "$0")/.." && pwd)
inc=()
[ -d "$root/.deps/usr/include" ] && inc=(-I"$root/.deps/usr/include")
static=(-static-libstdc++ -static-libgcc)

quick_bench() {  # quick_bench TREE OUT [NVCC FLAGS...]
  nvcc -std=c++17 -O3 -DNDEBUG "${@:3}" -gencode "arch=compute_$arch,code=sm_$arch" -I"$1/include" -I"$1" "${inc[@]}" -x cu -o "$2" \
    "$1/bench/quick_bench.cpp" "$1/src/impl.cu" -lcublas -Xcompiler "$(IFS=,; echo "${static[*]}")"
}

preset() {  # preset NAME: configure and build it at the device's paths
  local b=/tmp/gemma4_t4-build-$1 archs
  archs=$([ "$1" = gpu-native ] && echo "$arch" || echo 75-virtual)
  rm -rf "$b"
  cmake -S /tmp/gemma4_t4-src -B "$b" --preset "$1" -DGEMMA4_T4_CUDA_ARCHS="$archs" \
    -DCMAKE_PREFIX_PATH="$root/.deps/usr" -DCMAKE_EXE_LINKER_FLAGS="${static[*]}" > "$snap/prebuilt/configure-$1.log"
  local extra=()
  [ "$1" = gpu-native ] && read -r -a extra <<< "${LAB_TARGETS:-}"
  cmake --build "$b" -j "${JOBS:-1}" --target gemma4_t4_gpu_tests bench quick_bench make_synthetic "${extra[@]}" \
    > "$snap/prebuilt/build-$1.log"
}

mkdir -p "$snap/prebuilt"
pids=()
if [ -n "${PRESETS:-}" ]; then
  ln -sfn "$snap" /tmp/gemma4_t4-src
  for p in $PRESETS; do
    preset "$p" &
    pids+=($!)
  done
else
  g++ -std=c++17 -O2 "${inc[@]}" "$snap/tools/make_synthetic.cpp" -o "$snap/prebuilt/make_synthetic" -lpthread \
    "${static[@]}"
  quick_bench "$snap" "$snap/prebuilt/quick_bench" &
  pids+=($!)
  if [ "${KTRACE:-0}" = 1 ]; then  # the per-block timeline build (kernels/ktrace.cuh; gpu_check.sh ktrace)
    (quick_bench "$snap" "$snap/prebuilt/quick_bench_ktrace" -DGEMMA4_T4_KTRACE &&
      xz -f -T1 "$snap/prebuilt/quick_bench_ktrace") &
    pids+=($!)
  fi
fi
for t in "$@"; do  # xz: the device call carries at most 64 MiB (a quick_bench is 10 MB, 1.6 MB packed)
  (quick_bench "$snap/$t" "$snap/$t/quick_bench" && xz -f -T1 "$snap/$t/quick_bench") &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
if [ -n "${PRESETS:-}" ] && [ $rc -eq 0 ]; then
  # the build trees without their object files: what ctest and the steps run
  dirs=()
  for p in $PRESETS; do dirs+=("gemma4_t4-build-$p"); done
  tar -C /tmp --exclude='*.o' --exclude='*/CMakeFiles/*' -cJf "$snap/prebuilt/builds.tar.xz" "${dirs[@]}"
fi
outs=("$snap"/prebuilt/{quick_bench,quick_bench_ktrace.xz,make_synthetic,builds.tar.xz})
for t in "$@"; do outs+=("$snap/$t/quick_bench.xz"); done
for f in "${outs[@]}"; do [ ! -e "$f" ] || ls -l "$f"; done
exit $rc
