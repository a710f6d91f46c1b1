#!/usr/bin/env bash
# Compile-only test driver (registered by CMakeLists.txt as the compile.* ctest tests).
#
#   check.sh [--single-header HEADER] COMPILER ARG...
#
# Runs `COMPILER ARG...` in a fresh scratch directory (removed afterwards), so objects and executables land
# there; give sources as absolute paths. With --single-header, HEADER is copied alone into <scratch>/include
# as gemma4_t4.hpp and -I<scratch>/include is put first: the sources then see that one file and nothing else
# of this repository. The exit status is the compiler's.
set -euo pipefail

usage() {
  echo "usage: $0 [--single-header HEADER] COMPILER ARG..." >&2
  exit 2
}

single=""
if [[ "${1:-}" == --single-header ]]; then
  [[ $# -ge 2 ]] || usage
  single=$2
  shift 2
  [[ -f "$single" ]] || { echo "check.sh: single header '$single' not found (tools/amalgamate writes it)" >&2; exit 1; }
fi
[[ $# -ge 2 ]] || usage
compiler=$1
shift

scratch=$(mktemp -d "${TMPDIR:-/tmp}/gemma4_t4_compile.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
args=("$@")
if [[ -n "$single" ]]; then
  mkdir "$scratch/include"
  cp "$single" "$scratch/include/gemma4_t4.hpp"
  args=("-I$scratch/include" "${args[@]}")
fi
cd "$scratch"
echo "+ $compiler ${args[*]}"
"$compiler" "${args[@]}"
echo "ok"
