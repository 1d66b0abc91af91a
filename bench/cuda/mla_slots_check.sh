#!/bin/bash
# The MLA decode kernel's producer (PV warp 0) with its page-table loads used only when the copies
# go out (bench/results/2026-12-06-session40-mla-slots-late.patch) against main, and where the
# fp8_flashmla 16-head rows' warps stall (ncu, one and two S groups). Binaries built and packed on
# the CPU machine (no build here):
#   here:   P=bench/results/2026-12-06-session40-mla-slots-late.patch
#           bash bench/cuda/prebuilt.sh pack sl $P:strata_parity_test strata_bench_mla_bench \
#             $P:strata_bench_mla_bench
#   device: (carry .devcarry/sl, .devcarry/fxd)  bash bench/cuda/mla_slots_check.sh
# In order: the patched MLA parity suites; only if they pass, `mla_bench --what ceilings,sgroups`
# alternating main / patched twice each; then (NCU=1, the default) ncu on the patched bench's
# fp8_flashmla 16-head launches with one S group and with two by dims: warp states, issue, the
# SASS lines that hold the most stall samples (bench/cuda/ncu_source_top.py).
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
source bench/cuda/prebuilt.sh unpack sl || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxd"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
T=2026-12-06-session40-mla-slots-late
timeout 300 "$PB/${T}_strata_parity_test" \
  --gtest_filter="${PARITY_FILTER:-MlaAttention.Decode*:MlaBackend.*:MlaDcp.*}" >"$OUT/parity.log" 2>&1
rc=$?
echo "[parity @$(( $(date +%s) - t0 )) s] exit $rc"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/parity.log" | cut -c1-200 | head -20
[ $rc -eq 0 ] || { echo "parity failed: no benchmark"; exit 1; }
for i in $([ "${BENCH:-1}" = 1 ] && echo 1 2); do
  for v in main slots; do
    bin=$PB/strata_bench_mla_bench
    [ $v = slots ] && bin=$PB/${T}_strata_bench_mla_bench
    timeout 150 "$bin" --what ceilings,sgroups >"$OUT/mla_${v}_$i.log" 2>&1
    echo "[mla $v $i @$(( $(date +%s) - t0 )) s] exit $?"
    grep -E "^ceiling|^mla|^prof" "$OUT/mla_${v}_$i.log" | sed 's/ of latent rows//; s/batch 64 x ctx  4096,    1 new,  16 heads, //' | cut -c1-200
  done
done
if [ "${NCU:-1}" = 1 ]; then
  S="--section WarpStateStats --section SourceCounters --section SchedulerStats"
  S="$S --section SpeedOfLight --section LaunchStats --section InstructionStats --import-source no"
  L=$OUT/ncu
  mkdir -p "$L"
  for sg in 1 3; do
    timeout 200 ncu --clock-control none --kernel-name-base demangled \
      -k "regex:mla_decode_kernel<\\(int\\)2, \\(int\\)3, \\(int\\)3, \\(bool\\)0, \\(int\\)$sg>" --launch-skip 3 --launch-count 1 $S \
      -f -o "$L/flash_sg$sg" "$PB/${T}_strata_bench_mla_bench" --what sgroups >"$L/ncu_sg$sg.log" 2>&1
    echo "ncu flash sg$sg: exit $?"
    ncu -i "$L/flash_sg$sg.ncu-rep" --page details --print-units base >"$L/details_sg$sg.txt" 2>&1
    grep -E "Duration|Warp Cycles Per Issued|No Eligible|Issued Warp|Executed Ipc A|Registers|Issue Slots|Stall|Pipe" \
      "$L/details_sg$sg.txt" | head -30 | cut -c1-150
    ncu -i "$L/flash_sg$sg.ncu-rep" --page source --csv --print-source sass >"$L/sass_sg$sg.csv" 2>/dev/null
    python3 bench/cuda/ncu_source_top.py "$L/sass_sg$sg.csv" --top 40 >"$L/top_sg$sg.txt" 2>&1
    head -30 "$L/top_sg$sg.txt" | cut -c1-260
    gzip -f "$L/sass_sg$sg.csv" "$L/flash_sg$sg.ncu-rep"
  done
  tar cf "$OUT/ncu.tar" -C "$L" . && rm -rf "$L"
fi
echo "total: $(( $(date +%s) - t0 )) s"
