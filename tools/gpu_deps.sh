#!/usr/bin/env bash
# Unpacks the header-only dependencies of the GPU build (nlohmann/json, Catch2 v2) from Debian's packages into
# .deps/ (ignored by git), for a GPU machine that has no package manager: run it here, then name .deps in the
# device call's carry list; tools/gpu_check.sh configures with -DCMAKE_PREFIX_PATH=.deps/usr. Nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download nlohmann-json3-dev catch2 >/dev/null)
mkdir -p .deps
for f in "$tmp"/*.deb; do dpkg -x "$f" .deps/; done
echo ".deps: $(ls .deps/usr/include | tr '\n' ' ')"
