#!/usr/bin/env bash
# Runs the libFuzzer targets for a bounded time each over their seed corpora (fuzz/corpus/<name>)
# and reports executions per target; exits non-zero when any target finds a crash, a leak, a
# timeout or an out-of-memory. See FUZZING.md.
#
# Usage: fuzz/run.sh [-b BUILD_DIR] [-t SECONDS] [-j JOBS] [TARGET...]
#   -b  build dir configured with -DSTRATA_FUZZ=ON (default build-fuzz)
#   -t  seconds per target (default 30)
#   -j  targets run at once (default 2)
#   TARGET  names such as chat_template (default: every fuzz/*_fuzz.cc)
# New inputs go to BUILD_DIR/fuzz-work/<name>/ (not the checked-in corpus); a failing input is
# saved as BUILD_DIR/fuzz-work/<name>-artifacts/crash-*; add it to fuzz/corpus/<name>/ as
# crash_<what> with a regression test when fixing it.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build-fuzz; secs=30; jobs=2
while getopts "b:t:j:" o; do
  case $o in b) build=$OPTARG ;; t) secs=$OPTARG ;; j) jobs=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/*_fuzz.cc; do n=$(basename "$f" _fuzz.cc); targets+=("$n"); done
fi
work="$build/fuzz-work"
mkdir -p "$work"

run_one() {
  local name=$1 bin="$build/fuzz/strata_fuzz_$1"
  rm -f "$work/$name.rc"
  [ -x "$bin" ] || { echo "$name: $bin not built" > "$work/$name.log"; echo 1 > "$work/$name.rc"; return; }
  mkdir -p "$work/$name" "$work/$name-artifacts"
  # -timeout: one input taking longer is a hang; -rss_limit_mb: a hostile input must not OOM.
  # -seed: a fixed seed makes a CI run repeatable (set STRATA_FUZZ_SEED=0 for a random one by hand).
  "$bin" -max_total_time="$secs" -seed="${STRATA_FUZZ_SEED:-1}" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
    -print_final_stats=1 -artifact_prefix="$work/$name-artifacts/" \
    "$work/$name" "fuzz/corpus/$name" > "$work/$name.log" 2>&1
  echo $? > "$work/$name.rc"
}

for name in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  run_one "$name" &
done
wait
fail=0; total=0
for name in "${targets[@]}"; do
  if [ "$(cat "$work/$name.rc" 2>/dev/null)" = 0 ]; then status=ok; else status=FAILED; fail=1; fi
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$work/$name.log" | awk '{print $2}' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$work/$name.log" | tail -1 | awk '{print $2}')
  printf '%-18s %-6s execs %-10s cov %s\n' "$name" "$status" "${execs:-?}" "${cov:-?}"
  total=$((total + ${execs:-0}))
  if [ "$status" != ok ]; then
    grep -E 'ERROR|SUMMARY|==[0-9]+==|runtime error|Test unit written' "$work/$name.log" | head -20
    echo "  full log: $work/$name.log"
  fi
done
echo "fuzz total: $total executions, ${#targets[@]} targets x ${secs}s"
exit $fail
