#!/bin/bash
# A/B of uncommitted kernel changes on one GPU machine: the same commands against the working tree
# ("new") and against chosen files as they are at a base commit ("old"), one process after the
# other, so that machine-to-machine spread (several % on these benches) does not enter.
#   here:   bash bench/cuda/ab_check.sh prepare [BASE] FILE...   copies BASE's (default HEAD)
#           versions of FILE... into .devcarry/ab (carry it beside the usual carry)
#   device: AB_TARGETS="strata_bench_moe_bench ..." AB_CMDS=$'cmd1\ncmd2' bash bench/cuda/ab_check.sh
#           builds AB_TARGETS, runs AB_CMDS (one command a line) against the new tree, swaps the
#           old files in, rebuilds, runs them again (old), restores the new files, and with
#           AB_AGAIN=1 runs them once more (new2): outputs in $OUT/ab/{new,old,new2}.log (one file
#           a pass: the device tool returns a few files a call), filtered by AB_GREP on stdout.
# Parity (AB_PARITY: a gtest filter) runs on the new tree only, before the timings.
set -u
if [ "${1:-}" = prepare ]; then
  shift
  base=HEAD
  if [ $# -gt 0 ] && git rev-parse --verify -q "$1^{commit}" >/dev/null; then base=$1; shift; fi
  rm -rf .devcarry/ab && mkdir -p .devcarry/ab
  for f in "$@"; do
    mkdir -p ".devcarry/ab/$(dirname "$f")"
    git show "$base:$f" >".devcarry/ab/$f"
  done
  echo "$base $*" >.devcarry/ab/FILES
  echo ".devcarry/ab: $(cat .devcarry/ab/FILES)"
  exit 0
fi
source bench/cuda/device_env.sh
t0=$(date +%s)
A=$PWD/.devcarry/ab
[ -f "$A/FILES" ] || { echo "no .devcarry/ab (run: bash bench/cuda/ab_check.sh prepare FILE...)"; exit 1; }
read -r _base files <"$A/FILES"
# A machine still warm from an earlier call keeps its build-dev, built last from the old files;
# the tree's new files arrive with this machine's older mtimes, so ninja would keep the old
# objects for the "new" pass (seen 2026-12-05: a first pass that timed the old code). Touch them.
touch $files
L=$OUT/ab
mkdir -p "$L" "$L/newfiles"
dev_configure
dev_build strata_parity_test $AB_TARGETS
echo "build: $(( $(date +%s) - t0 )) s"
[ -n "${AB_PARITY:-}" ] && dev_parity ab "$AB_PARITY" 400
run_all() {  # LABEL
  local c
  mapfile -t cmds <<<"$AB_CMDS"
  for c in "${cmds[@]}"; do
    [ -n "$c" ] || continue
    timeout 300 bash -c "$c" >"$L/run.log" 2>&1
    echo "[$1: exit $?] $c" | cut -c1-200
    grep -E "${AB_GREP:-.}" "$L/run.log" | cut -c1-250 | head -40
    { echo "==== $c"; cat "$L/run.log"; } >>"$L/$1.log"
  done
  rm -f "$L/run.log"
}
run_all new
for f in $files; do mkdir -p "$L/newfiles/$(dirname "$f")"; cp "$f" "$L/newfiles/$f"; cp "$A/$f" "$f"; done
dev_build $AB_TARGETS
run_all old
for f in $files; do cp "$L/newfiles/$f" "$f"; done
if [ "${AB_AGAIN:-0}" = 1 ]; then
  dev_build $AB_TARGETS
  run_all new2
fi
rm -rf "$L/newfiles"
echo "total: $(( $(date +%s) - t0 )) s"
