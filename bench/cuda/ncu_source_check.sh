#!/bin/bash
# Where a kernel's warps stall, instruction by instruction (issue 23's MoE prefill GEMM, issue 22's
# MLA decode): Nsight Compute's warp-state sampling per SASS instruction, one build, on the GPU
# machine from the repository root (carry STRATA_CARRY=$PWD/.devcarry/bench: debs and
# shared/configs). For each case: one profiled launch with the WarpStateStats, SourceCounters and
# SchedulerStats sections saved as a report, its source page exported as SASS with the sampling
# columns (CSV), and ncu_source_top.py printing the instructions that hold the most stall samples,
# by reason. Cases (SOURCE_CASES, default "gu_dsv3 gu_moonlight mla16"):
#   gu_dsv3 / gu_kimi / gu_moonlight: the MoE prefill gate_up GEMM at SOURCE_TOKENS (8192), the
#     product's kernel (the producer-warp GEMM where it applies, moe_experts_gemm_pipe.cu)
#   dn_dsv3: the down projection (the weight-stationary kernel) at the same size
#   mla16: the MLA decode kernel, 64 x 4,096, 16 heads, bf16 rows (mla_bench's acceptance row)
# Back: $OUT/source_top.txt (the tables) and $OUT/source.tar (reports, CSVs, logs).
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata_bench_moe_bench strata_bench_mla_bench
echo "build: $(( $(date +%s) - t0 )) s"
L=$OUT/source
mkdir -p "$L"
T=${SOURCE_TOKENS:-8192}
S="--section WarpStateStats --section SourceCounters --section SchedulerStats"
S="$S --section SpeedOfLight --section LaunchStats --import-source no"
moe() {  # CONFIG: the MoE bench at T tokens, one call
  echo ./build-dev/strata_bench_moe_bench --what kernels --configs "$1" --tokens "$T" --sweep 0 \
    --calls 1 --reps 1
}
for c in ${SOURCE_CASES:-gu_dsv3 gu_moonlight mla16}; do
  case $c in
    gu_*) re='moe_gemm_(pipe_)?kernel'; skip=0; cmd=$(moe "${c#gu_}") ;;
    dn_*) re='moe_gemm_ws_kernel'; skip=0; cmd=$(moe "${c#dn_}") ;;
    mla16) re='mla_decode_kernel'; skip=2
      cmd="./build-dev/strata_bench_mla_bench --what acceptance" ;;
    *) echo "unknown case $c"; continue ;;
  esac
  timeout 240 ncu --clock-control none -k "regex:$re" --launch-skip $skip --launch-count 1 $S \
    -f -o "$L/$c" $cmd >"$L/ncu_$c.log" 2>&1
  echo "ncu $c: exit $?"
  ncu -i "$L/$c.ncu-rep" --page details --print-units base >"$L/details_$c.txt" 2>&1
  grep -E "Function Name|  void|Duration|Warp Cycles Per Issued|No Eligible|Executed Ipc A|Registers" \
    "$L/details_$c.txt" | head -12 | cut -c1-160
  ncu -i "$L/$c.ncu-rep" --page source --csv --print-source sass >"$L/sass_$c.csv" 2>"$L/sass_$c.err"
  echo "source page $c: exit $?, $(wc -l <"$L/sass_$c.csv") lines"
  python3 bench/cuda/ncu_source_top.py "$L/sass_$c.csv" --top 60 >"$L/top_$c.txt" 2>&1
  head -4 "$L/top_$c.txt" | cut -c1-600
  gzip -f "$L/sass_$c.csv" "$L/$c.ncu-rep"
done
# One file back (the device tool returns a few files a call): the tables, CSVs and reports.
cat "$L"/top_*.txt >"$OUT/source_top.txt"
tar cf "$OUT/source.tar" -C "$L" . && rm -rf "$L"
echo "total: $(( $(date +%s) - t0 )) s"
