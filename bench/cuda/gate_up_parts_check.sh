#!/bin/bash
# Issue 23: how much of the MoE prefill gate_up (the pipe kernel, 8,192 tokens) its L2 traffic
# costs — session 36's next step (bench/results/2026-12-06-session36.md). On the GPU machine,
# with binaries packed on the CPU machine (no build here):
#   here:   bash bench/cuda/prebuilt.sh pack gu strata_bench_wgmma_probe \
#             bench/results/2026-12-06-session36-pipe-parts.patch:strata_bench_moe_bench \
#             bench/results/2026-12-06-session36-prepared-gate-up-x2.patch:strata_bench_moe_bench
#   device: (carry .devcarry/gu) bash bench/cuda/gate_up_parts_check.sh
# In order: the probe (the consumer loop alone, random data, against cuBLAS); moe_bench of the x2
# binary with STRATA_PIPE_X2 unset (main's kernel); the parts binary with STRATA_PIPE_EXP 2 (x
# copied from one L2-resident place: no gather), 8 (weights likewise), 10 (both), 1 (fragments
# raw: no dequantization); the x2 binary with STRATA_PIPE_X2=1 (x shared in clusters of 2; its
# "regimes agree" NMSE, decode against prefill, is the correctness check: as main's, ~1e-6 or
# 0); main again (the H100's power state moves a process's timings several %: read each against
# the mains around it). gate_up µs of each on stdout, the logs under $OUT.
# (Session 37 ran the x2 form in x2_owed_check.sh: +22-39% on gate_up, dropped; the parts runs and
# the probe with random data have not run yet.)
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
source bench/cuda/prebuilt.sh unpack "${PREBUILT:-gu}" || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 120 "$PB/strata_bench_wgmma_probe" >"$OUT/probe.log" 2>&1
echo "probe: exit $?"
grep -E "^ceiling|^probe" "$OUT/probe.log"
PARTS=$PB/2026-12-06-session36-pipe-parts_strata_bench_moe_bench
X2=$PB/2026-12-06-session36-prepared-gate-up-x2_strata_bench_moe_bench
source bench/cuda/moe_prefill_ab.sh
run() {  # LABEL BINARY [STRATA_PIPE_EXP] [STRATA_PIPE_X2]
  STRATA_PIPE_EXP=${3:-0} STRATA_PIPE_X2=${4:-0} moe_prefill_ab "$1" "$2"
}
run main "$X2"
run x_l2 "$PARTS" 2
run w_l2 "$PARTS" 8
run both_l2 "$PARTS" 10
run raw "$PARTS" 1
run x2 "$X2" 0 1
run main2 "$X2"
run x2_again "$X2" 0 1
echo "total: $(( $(date +%s) - t0 )) s"
