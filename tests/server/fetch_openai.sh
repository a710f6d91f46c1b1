#!/usr/bin/env bash
# Fetches the official OpenAI client for JavaScript -- the npm package `openai`, pinned and checked by SHA-256 --
# for tests/server/test_server.py (case openai). Version 5.23.2 has no dependencies and runs on Node 18+ (its
# global fetch), so the unpacked tarball is all it needs.
#
#   tests/server/fetch_openai.sh DIR       writes DIR/openai (the package); exit status 0 on success
#
# Needs npm and access to the npm registry; bounded by FETCH_TIMEOUT (default 180 s).
set -euo pipefail

version=5.23.2
sha256=a2aa74ff8be1a80a215af201a3d2228e999464d166c1eaec2c9ca313395fbef1
dir=${1:?usage: fetch_openai.sh DIR}

if [[ -f "$dir/openai/package.json" ]] && grep -q "\"version\": \"$version\"" "$dir/openai/package.json"; then
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_openai: npm not found" >&2; exit 1; }
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && timeout "${FETCH_TIMEOUT:-180}" npm pack --silent "openai@$version" >/dev/null); then
  echo "fetch_openai: npm pack openai@$version failed or took longer than ${FETCH_TIMEOUT:-180} s" >&2
  exit 1
fi
if ! echo "$sha256  $tmp/openai-$version.tgz" | sha256sum --check --status; then
  echo "fetch_openai: openai-$version.tgz has an unexpected SHA-256" >&2
  exit 1
fi
tar -xzf "$tmp/openai-$version.tgz" -C "$tmp"
rm -rf "$dir/openai.$$"
mv "$tmp/package" "$dir/openai.$$"
rm -rf "$dir/openai"
mv "$dir/openai.$$" "$dir/openai"
echo "fetch_openai: openai $version in $dir/openai"
