#!/bin/bash
# Hidden-state capture on one H200 (issue 25), from the repository root on the GPU machine with
# `.devcarry/all` carried (both house models, the hidden-state fixtures, configs, data):
#   STRATA_CARRY=$PWD/.devcarry/all bash bench/cuda/capture_run.sh
# The throughput stage alone needs only `.devcarry/cuda` (the default carry):
#   STAGES=throughput bash bench/cuda/capture_run.sh
# Stages (STAGES, default "parity throughput"):
#   parity      tests/parity/capture_parity_test.cc: CUDA capture (bf16 activations, device copies
#               in the forward, one raw download per step) vs the CPU reference's float32 capture and
#               Hugging Face's states (tests/fixtures/hidden_states), house-llama and house-mla,
#               every layer's output and the final norm; bound: rel max error < 3e-2 per block
#   throughput  first the capture blocks' page-locked download against the staged one
#               (strata_parity_test CudaCaptureBlock.*), then the 8B Llama shape with random
#               weights (strata_bench_make_checkpoint, as deepseek_e2e_run.sh's generate stage),
#               1,000 short chat prompts of
#               data/prompts-explain.jsonl x 1,024 tokens (--ignore-eos, greedy): `strata generate`
#               without and with --capture-hidden-states eagle3; prints both throughputs, their
#               ratio (acceptance: >= 0.85), bytes per token and the disk write rate, how long
#               the job ran after its last generated token (the end-of-run stall), where the
#               capture's time went (the job's counters: per step download; on the capture
#               writer's thread scatter and the rows streamed to the record files; the engine's
#               waits on that writer, queue_wait (no free block: the writer is behind) and
#               fence_wait (a finished request's rows not yet stored); per record write, per group
#               sync and index), each run's engine step split (STRATA_STEP_TIMING: forward vs the
#               host's rest of the step, the last two 256-step windows), and the
#               disk's own write ceiling measured first in the same directory (dd: one stream with
#               fdatasync, one with O_DIRECT, four in parallel; /dev/shm as the upper bound). The
#               states go to the local disk when it has the room the job says it needs, else
#               /dev/shm (then the write rate is memory's; the log says which).
# Under 5 minutes after the build; logs in $OUT.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata strata_parity_test strata_bench_make_checkpoint
echo "build: $(( $(date +%s) - t0 )) s"
W=${WORK:-/tmp/strata_capture}
mkdir -p "$W"
# disk_ceiling DIR: GB/s of 2 GiB written to DIR: one buffered stream then fdatasync, one O_DIRECT
# stream, four buffered streams of 512 MiB each then fdatasync (what several record files in
# flight look like). Each under 20 s; the files are removed.
disk_ceiling() {
  local d=$1 mb=${DD_MB:-2048} t f rc
  local n=$((mb / 64)) bytes=$((mb * 1048576))
  echo "disk $d: $(df -h --output=fstype,size,avail "$d" | tail -1)"
  rate() {  # rate NAME START_TIME EXIT_STATUS
    local note=""
    [ "$3" != 0 ] && note=" (exit status $3: timed out or failed; the rate is not the disk's)"
    python3 -c "print(f'  {\"$1\":24s} {$bytes / 1e9 / max($(date +%s.%N) - $2, 1e-9):.2f} GB/s$note')"
  }
  t=$(date +%s.%N)
  timeout 20 dd if=/dev/zero of="$d/dd_seq" bs=64M count=$n conv=fdatasync status=none
  rate "one stream + fdatasync" "$t" $?
  rm -f "$d/dd_seq"
  if [ "$d" != /dev/shm ]; then
    t=$(date +%s.%N)
    timeout 20 dd if=/dev/zero of="$d/dd_direct" bs=64M count=$n oflag=direct status=none
    rate "one stream O_DIRECT" "$t" $?
    rm -f "$d/dd_direct"
  fi
  t=$(date +%s.%N)
  rc=0
  for f in 1 2 3 4; do
    timeout 20 dd if=/dev/zero of="$d/dd_par$f" bs=64M count=$((n / 4)) conv=fdatasync status=none &
  done
  for f in 1 2 3 4; do wait -n || rc=$?; done
  rate "4 streams + fdatasync" "$t" $rc
  rm -f "$d"/dd_par*
}
grep -E "MemTotal|Dirty:" /proc/meminfo | tr -s ' ' | paste -sd ' '
echo "vm.dirty_ratio $(cat /proc/sys/vm/dirty_ratio), dirty_background_ratio $(cat /proc/sys/vm/dirty_background_ratio)"
for stage in ${STAGES:-parity throughput}; do
  t1=$(date +%s)
  case $stage in
    parity)
      ./build-dev/strata_parity_test --gtest_filter='HouseModels/CudaCapture.*' >"$OUT/capture_parity.log" 2>&1
      echo "parity: exit status $?"
      grep -E "rel max error|OK|FAILED|PASSED|Failure|Expected" "$OUT/capture_parity.log" | tail -48 ;;
    throughput)
      # The capture blocks' page-locked download (engine/capture_block.h) against the staged one.
      ./build-dev/strata_parity_test --gtest_filter='CudaCaptureBlock.*' >"$OUT/capture_block.log" 2>&1
      echo "pinned capture-block download vs staged: exit status $? ($(grep -cE '^\[       OK' "$OUT/capture_block.log") passed)"
      ./build-dev/strata_bench_make_checkpoint --config "$C/shared/configs/llama-3.1-8b/config.json" \
        --out "$W/llama8b-random" --tokenizer "$C/shared/models/house-llama" >"$OUT/make_checkpoint.log" 2>&1 ||
        { tail -5 "$OUT/make_checkpoint.log"; exit 1; }
      # The checkpoint (~16 GB) must be on disk before the baseline runs: its dirty pages flushing
      # during the run without capture skewed the ratio (12 GB dirty at its start, 2026-12-02).
      sync
      head -1000 "$C/shared/data/prompts-explain.jsonl" >"$W/prompts.jsonl"
      disk_ceiling "$W"
      disk_ceiling /dev/shm
      gen() {  # gen NAME OUTPUT_DIR [flags]: one run; its summary lines; its wall time in $OUT/wall_NAME
        local name=$1 dir=$2
        shift 2
        rm -rf "$dir"
        mkdir -p "$dir"
        local s=$(date +%s.%N)
        STRATA_STEP_TIMING=1 timeout 280 ./build-dev/strata generate --device cuda --model-path "$W/llama8b-random" \
          --input "$W/prompts.jsonl" -o "$dir/out.jsonl" --max-new-tokens 1024 --ignore-eos --temperature 0 \
          --progress-interval 10 "$@" >"$OUT/generate_$name.log" 2>&1
        local rc=$?
        python3 -c "import time; print(round(time.time() - $s, 2))" >"$OUT/wall_$name"
        echo "$name: rc $rc, wall $(cat "$OUT/wall_$name") s"
        grep -E "finished in|hidden-state capture|error" "$OUT/generate_$name.log" | head -6
        grep -E "engine steps:" "$OUT/generate_$name.log" | tail -2
        return $rc
      }
      gen plain "$W/plain"
      # The states of 1,000 x ~1,070 tokens x 32 KiB: ~36 GB. The job refuses to start (naming
      # both numbers) when the disk lacks them; /dev/shm then.
      CAP="$W/capture"
      if ! gen capture "$CAP" --capture-hidden-states eagle3; then
        if grep -q "free; free space" "$OUT/generate_capture.log"; then
          echo "capture: the local disk lacks the room (refused as designed); again on /dev/shm"
          CAP=/dev/shm/strata_capture
          gen capture "$CAP" --capture-hidden-states eagle3
        fi
      fi
      python3 - "$OUT" "$CAP/hidden/out" <<'PY'
import json, os, re, sys
out, hidden = sys.argv[1], sys.argv[2]
def rate(name):
    m = re.findall(r"generation ([0-9.]+) tok/s", open(f"{out}/generate_{name}.log").read())
    return float(m[-1]) if m else 0.0
plain, cap = rate("plain"), rate("capture")
wall = float(open(f"{out}/wall_capture").read())
records = tokens = 0
if os.path.exists(os.path.join(hidden, "index.jsonl")):
    for line in open(os.path.join(hidden, "index.jsonl")):
        records += 1
        tokens += json.loads(line)["tokens"]
size = sum(os.path.getsize(os.path.join(hidden, f)) for f in os.listdir(hidden)) if os.path.isdir(hidden) else 0
print(f"throughput: without capture {plain:.0f} tok/s, with --capture-hidden-states eagle3 {cap:.0f} tok/s: "
      f"ratio {cap / plain if plain else 0:.3f} (acceptance >= 0.85)")
print(f"capture: {records} records, {tokens} tokens, {size / 1e9:.2f} GB in {hidden}: "
      f"{size / tokens if tokens else 0:.0f} bytes per token stored; write rate {size / wall / 1e9:.2f} GB/s "
      f"over the run's {wall:.0f} s wall (model load included)")
log = open(f"{out}/generate_capture.log").read()
m = re.search(r"job ended ([0-9.]+) s after its last generated token", log)
print(f"end of the run: the job ended {m.group(1) if m else '?'} s after its last generated token "
      f"(the last records' tail requests, the writer, the last commit)")
m = re.search(r"where the time went: (.*)", log)
if m:
    print("where the capture's time went:")
    for part in m.group(1).split("; "):
        print(f"  {part}")
PY
      rm -rf "$W/llama8b-random" "$W/plain" "$W/capture" /dev/shm/strata_capture ;;
  esac
  echo "-- $stage: $(( $(date +%s) - t1 )) s"
done
echo "total: $(( $(date +%s) - t0 )) s"
