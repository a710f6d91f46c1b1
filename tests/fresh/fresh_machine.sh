#!/usr/bin/env bash
# The README's two commands as a fresh Debian 12 machine sees them (issue 14), without changing this machine.
#
#   tests/fresh/fresh_machine.sh check            what .ci/run runs
#   tests/fresh/fresh_machine.sh quick-start      times the README's first command, as it is, to chat's answer
#
# How: in a private mount namespace (unshare -m), /usr, /etc and /var are overlays whose changes land in a
# scratch folder, and the project's Debian packages (those tools/setup installs, less the toolchain) are
# purged there with apt-get (files and dpkg records), so configure, tools/setup and the build see a machine
# that never had them. tools/setup then installs them for real, from the Debian registry, into the overlay.
# Nothing outside the namespace changes: the host keeps its packages, the scratch folder is removed.
#
# check:
#   1. tools/setup --dry-run names every purged package; `tools/setup --tests --dry-run` adds the test ones.
#   2. configure stops and names each missing package and the option that avoids it (nlohmann-json3-dev in 1;
#      libsentencepiece-dev, libedit-dev, catch2 in turn, each option moving it on to the next), and passes
#      with the options; without cpp-httplib it passes and says the server example is not built; without
#      catch2 alone the quick start's configure (tests off) passes.
#   3. The README's first command, from a fresh clone, with nothing installed and no CUDA (/usr/local/cuda
#      hidden too, so CI's build stays short): tools/setup installs, configure, build chat (a Release build:
#      no warning may appear), chat answers a line typed at its prompt (through a pseudo-terminal), Ctrl-D
#      leaves.
#   4. `tools/setup --tests` then installs the test packages and the tests configure (the README's second
#      command up to the build; build-ci builds and runs the tests themselves).
# quick-start: 3. alone, CUDA left visible (nvcc builds for this machine's GPU, or sm_75 without one), timed
#   from the command's start to chat's first answer; the time goes to stdout and $OUT/quick_start.txt.
#
# Needs root (or sudo), unshare, overlayfs and the Debian registry. Exit status: 0 ok, 1 a check failed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MODE=${1:-check}
# The packages tools/setup installs that a bare Debian 12 with a compiler lacks.
FRESH=(nlohmann-json3-dev libsentencepiece-dev libedit-dev catch2 libcpp-httplib-dev)

if [[ $MODE != check && $MODE != quick-start && $MODE != inside ]]; then
  sed -n '2,26s/^# \{0,1\}//p' "$0" >&2
  exit 2
fi

if [[ $MODE != inside ]]; then
  sudo=()
  if [[ $(id -u) != 0 ]]; then sudo=(sudo); fi
  scratch=$(mktemp -d /tmp/gemma4_t4_fresh.XXXXXX)
  trap '"${sudo[@]}" rm -rf "$scratch"' EXIT
  rc=0
  "${sudo[@]}" env SCRATCH="$scratch" FRESH_MODE="$MODE" OUT="${OUT:-}" unshare -m --propagation private \
    "$0" inside || rc=$?
  exit $rc
fi

# ---- inside the namespace ----
say() { printf '\n---- fresh machine (%d s): %s ----\n' "$SECONDS" "$*"; }
die() {
  printf 'FAIL (fresh machine): %s\n' "$*" >&2
  exit 1
}

# Overlays over /usr, /etc and /var: writes (purges, installs) go to $SCRATCH, the host's files stay as they are.
overlay() {
  local d=$1 name=${1//\//_}
  mkdir -p "$SCRATCH/$name/up" "$SCRATCH/$name/work"
  mount -t overlay overlay -o "lowerdir=$d,upperdir=$SCRATCH/$name/up,workdir=$SCRATCH/$name/work" "$d"
}
# A scenario runs in a subshell with fresh overlays on top of the current ones, so purges do not carry over.
fresh_layers() {
  local base=$SCRATCH
  SCRATCH=$(mktemp -d "$base/scenario.XXXXXX")
  for d in /usr /etc /var; do overlay "$d"; done
  SCRATCH=$base
}
drop_layers() { umount -l /usr /etc /var; }
purge() {  # the packages and whatever was installed only for them
  local autoremove=--autoremove
  # The checks need the packages gone, not the orphans (the time goes to apt's dependency solving).
  [[ $FRESH_MODE == quick-start ]] || autoremove=
  env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $autoremove "$@" >"$SCRATCH/purge.log" 2>&1 ||
    die "apt-get purge $* failed: $(tail -5 "$SCRATCH/purge.log")"
  for p in "$@"; do
    if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) == "install ok installed" ]]; then
      die "$p still installed after the purge"
    fi
  done
}
installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true) == "install ok installed" ]]; }

# configure SOURCE BUILD ARGS... -> its output in $SCRATCH/configure.log; returns cmake's status.
configure() {
  local src=$1 build=$2
  shift 2
  rm -rf "$build"
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGEMMA4_T4_CUDA=OFF "$@" >"$SCRATCH/configure.log" 2>&1
}
expect_configure_fails() {  # LABEL WORDS -- ARGS...
  local label=$1 words=$2
  shift 3
  if configure "$ROOT" "$SCRATCH/build-cfg" "$@"; then die "$label: configure passed; expected it to stop"; fi
  local flat
  flat=$(tr -s ' \n' ' ' <"$SCRATCH/configure.log")
  local w
  IFS='|' read -ra ws <<<"$words"
  for w in "${ws[@]}"; do
    [[ $flat == *"$w"* ]] || die "$label: the configure error does not name '$w':
$(cat "$SCRATCH/configure.log")"
  done
  echo "ok: $label: configure stops naming: ${ws[*]}"
}
expect_configure_passes() {  # LABEL WORDS -- ARGS...
  local label=$1 words=$2
  shift 3
  configure "$ROOT" "$SCRATCH/build-cfg" "$@" || die "$label: configure failed:
$(cat "$SCRATCH/configure.log")"
  local w
  IFS='|' read -ra ws <<<"$words"
  for w in "${ws[@]}"; do
    [[ -z $w ]] || grep -qF -- "$w" "$SCRATCH/configure.log" || die "$label: configure does not say '$w'"
  done
  echo "ok: $label: configure passes"
}

# The README's commands, as written there (the line after each marker comment's code fence).
readme_command() {  # PREFIX: the command line in README.md that starts with it
  local line
  line=$(grep -m1 -E "^$1" "$ROOT/README.md" || true)
  [[ -n $line ]] || die "README.md has no command line starting with '$1'"
  printf '%s\n' "$line"
}

# Runs the README's first command in a fresh clone, in a pseudo-terminal; types a line at chat's prompt when it
# comes, waits for the answer, then Ctrl-D. Prints the seconds from the command's start to the answer.
quick_start() {
  local clone=$SCRATCH/clone cmd
  git clone -q "$ROOT" "$clone"
  cmd=$(readme_command 'tools/setup && ')
  echo "+ (in a fresh clone) $cmd"
  python3 "$ROOT/tests/fresh/drive_chat.py" "$clone" "$cmd" "$SCRATCH/quick_start.log" ||
    die "the README's first command did not end in an answering chat (log: $(tail -40 "$SCRATCH/quick_start.log"))"
  # A Release build (the quick start's) prints no warning either: CI's -Werror builds are RelWithDebInfo.
  if grep -n "warning:" "$SCRATCH/quick_start.log"; then die "the quick start's Release build printed warnings"; fi
  echo "ok: the Release build of the library and chat printed no warning"
  if [[ -n ${OUT:-} ]]; then cp "$SCRATCH/quick_start.log" "$OUT/"; fi
}

say "private overlays of /usr, /etc, /var (scratch $SCRATCH)"
for d in /usr /etc /var; do overlay "$d"; done
if [[ $FRESH_MODE == check ]]; then
  rm -f /var/lib/man-db/auto-update  # no man-db index rebuilds after each purge and install (seconds each)
fi
# The clone is read as root: git's ownership check would refuse a checkout owned by someone else.
printf '[safe]\n\tdirectory = *\n' >"$SCRATCH/gitconfig"
export GIT_CONFIG_GLOBAL=$SCRATCH/gitconfig

if [[ $FRESH_MODE == check ]]; then
  say "1. tools/setup on a machine without the packages"
  (
    fresh_layers
    purge "${FRESH[@]}"
    out=$("$ROOT/tools/setup" --dry-run)
    echo "$out"
    for p in nlohmann-json3-dev libsentencepiece-dev libedit-dev; do
      [[ $out == *" $p"* ]] || die "tools/setup --dry-run does not name $p: $out"
    done
    [[ $out != *catch2* ]] || die "tools/setup (no --tests) wants catch2: $out"
    out=$("$ROOT/tools/setup" --tests --dry-run)
    echo "$out"
    for p in catch2 libcpp-httplib-dev; do [[ $out == *" $p"* ]] || die "tools/setup --tests does not name $p: $out"; done
    expect_configure_fails "nothing installed" "nlohmann-json3-dev|tools/setup" -- -DGEMMA4_T4_BUILD_TESTS=OFF
    drop_layers
  )
  say "2. the packages of the options missing: configure names each in turn, then passes with the options"
  (
    fresh_layers
    purge libsentencepiece-dev libedit-dev catch2 libcpp-httplib-dev
    # configure stops at the first missing one; the option that avoids it moves it on to the next.
    expect_configure_fails "no libsentencepiece" "libsentencepiece-dev|-DGEMMA4_T4_SENTENCEPIECE=OFF" --
    expect_configure_fails "no libedit" "libedit-dev|-DGEMMA4_T4_LIBEDIT=OFF" -- -DGEMMA4_T4_SENTENCEPIECE=OFF
    expect_configure_fails "no catch2, tests on" "catch2|-DGEMMA4_T4_BUILD_TESTS=OFF" -- \
      -DGEMMA4_T4_SENTENCEPIECE=OFF -DGEMMA4_T4_LIBEDIT=OFF
    expect_configure_passes "all four missing, their options off" "cpp-httplib not found|libcpp-httplib-dev" -- \
      -DGEMMA4_T4_SENTENCEPIECE=OFF -DGEMMA4_T4_LIBEDIT=OFF -DGEMMA4_T4_BUILD_TESTS=OFF
    drop_layers
  )
  (
    fresh_layers
    purge catch2
    expect_configure_passes "no catch2, tests off (the quick start's configure)" "" -- -DGEMMA4_T4_BUILD_TESTS=OFF
    drop_layers
  )
  say "3. the README's first command on a machine without the packages and without CUDA"
  (
    fresh_layers
    purge "${FRESH[@]}"
    # No CUDA either (whiteouts in the overlay): CI's build stays CPU-only, as on a machine without the toolkit.
    rm -rf /usr/local/cuda /usr/local/cuda-*
    for f in /usr/local/bin/*; do
      if [[ -f $f ]] && grep -qs "/usr/local/cuda" "$f"; then rm -f "$f"; fi
    done
    unset CUDACXX CUDA_HOME CUDA_PATH
    quick_start
    say "4. the README's second command: tools/setup --tests, then the tests configure"
    "$ROOT/tools/setup" --tests
    for p in catch2 libcpp-httplib-dev; do installed "$p" || die "tools/setup --tests did not install $p"; done
    expect_configure_passes "after tools/setup --tests, tests on" "cpp-httplib 0" -- -DGEMMA4_T4_BUILD_TESTS=ON
    drop_layers
  )
  say "ok"
else
  say "the README's first command, timed, on a machine without the packages"
  purge "${FRESH[@]}"
  quick_start
fi
