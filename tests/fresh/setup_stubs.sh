#!/usr/bin/env bash
# tools/setup against stand-ins for dpkg-query, apt-get, sudo and id (ctest: tools.setup): what it installs,
# and how, for each case a real machine may be in -- without installing anything.
#
#   1. every package present: no apt-get at all, exit 0;
#   2. some missing, as root: apt-get update, then apt-get install of exactly the missing ones, no sudo;
#   3. some missing, not root, sudo there: the same through sudo;
#   4. some missing, not root, no sudo: exit 1, a message naming the packages and the command to run as root;
#   5. --dry-run: names what it would install, runs no apt-get; --list prints the sets (--tests adds catch2).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/gemma4_t4_setup.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
stubs=$scratch/bin
mkdir -p "$stubs"
log=$scratch/calls.log

fail() {
  echo "FAIL: $*" >&2
  echo "---- calls ----" >&2
  cat "$log" >&2 || true
  exit 1
}

# dpkg-query -W -f=... PKG: "install ok installed" unless PKG is in $MISSING.
cat >"$stubs/dpkg-query" <<'EOF'
#!/usr/bin/env bash
pkg=${!#}
for m in $MISSING; do [[ $m == "$pkg" ]] && exit 1; done
printf 'install ok installed'
EOF
cat >"$stubs/apt-get" <<'EOF'
#!/usr/bin/env bash
echo "apt-get $*" >>"$CALLS"
EOF
cat >"$stubs/sudo" <<'EOF'
#!/usr/bin/env bash
echo "sudo" >>"$CALLS"
exec "$@"
EOF
cat >"$stubs/id" <<'EOF'
#!/usr/bin/env bash
echo "${FAKE_UID:-0}"
EOF
chmod +x "$stubs"/*

# run_setup NAME UID WITH_SUDO MISSING ARGS...: tools/setup with the stand-ins first on PATH (sudo removed from
# a copy of the directory when WITH_SUDO is 0); its output in $scratch/NAME.out, its status returned.
run_setup() {
  local name=$1 uid=$2 with_sudo=$3 missing=$4
  shift 4
  local bin=$scratch/bin-$name
  cp -r "$stubs" "$bin"
  [[ $with_sudo == 1 ]] || rm -f "$bin/sudo"
  : >"$log"
  local rc=0
  # PATH: the stand-ins, then the system's directories without any other sudo.
  env -i PATH="$bin:/usr/bin:/bin" HOME="$scratch" CALLS="$log" MISSING="$missing" FAKE_UID="$uid" \
    bash "$ROOT/tools/setup" "$@" >"$scratch/$name.out" 2>&1 || rc=$?
  if [[ $with_sudo == 0 && -x /usr/bin/sudo ]]; then
    echo "note: /usr/bin/sudo exists, so case '$name' cannot hide it; its checks are skipped"
    return 99
  fi
  return $rc
}

# 1. all present
run_setup present 0 1 "" || fail "all present: exit status $?"
[[ ! -s $log ]] || fail "all present: apt-get or sudo was called"
grep -q "all present" "$scratch/present.out" || fail "all present: it does not say so"
echo "ok: all present: nothing run"

# 2. missing, root
run_setup root 0 1 "libedit-dev nlohmann-json3-dev" || fail "root: exit status $?"
grep -q "^sudo" "$log" && fail "root: sudo was used"
grep -q "^apt-get .*update" "$log" || fail "root: no apt-get update"
install=$(grep "^apt-get .*install" "$log" || true)
[[ $install == *" nlohmann-json3-dev"* && $install == *" libedit-dev"* ]] || fail "root: install line: $install"
[[ $install != *cmake* && $install != *catch2* ]] || fail "root: installs packages that are present: $install"
echo "ok: missing, as root: apt-get update + install of the two missing"

# 3. missing, not root, with sudo
run_setup user 1000 1 "catch2" --tests || fail "user with sudo: exit status $?"
[[ $(grep -c "^sudo" "$log") == 2 ]] || fail "user with sudo: apt-get update and install not both through sudo"
grep -q "^apt-get .*install.* catch2" "$log" || fail "user with sudo: catch2 not installed"
echo "ok: missing, not root: through sudo"

# 4. missing, not root, no sudo
rc=0
run_setup nosudo 1000 0 "catch2" --tests || rc=$?
if [[ $rc != 99 ]]; then
  [[ $rc == 1 ]] || fail "no sudo: exit status $rc, wanted 1"
  [[ ! -s $log ]] || fail "no sudo: apt-get was called"
  grep -q "not root and no sudo" "$scratch/nosudo.out" || fail "no sudo: no message"
  grep -q "apt-get install catch2" "$scratch/nosudo.out" || fail "no sudo: the message does not give the command"
  echo "ok: missing, not root, no sudo: exit 1 naming the command"
fi

# 5. --dry-run, --list
run_setup dry 0 1 "catch2 libedit-dev" --tests --dry-run || fail "--dry-run: exit status $?"
[[ ! -s $log ]] || fail "--dry-run ran apt-get"
grep -q "would install: libedit-dev catch2" "$scratch/dry.out" || fail "--dry-run: $(cat "$scratch/dry.out")"
base=$(bash "$ROOT/tools/setup" --list)
tests=$(bash "$ROOT/tools/setup" --tests --list)
[[ $base == *nlohmann-json3-dev* && $base == *libedit-dev* && $base != *catch2* ]] || fail "--list: $base"
[[ $tests == *catch2* && $tests == *libcpp-httplib-dev* ]] || fail "--tests --list: $tests"
echo "ok: --dry-run and --list"
echo "5 passed, 0 failed"
