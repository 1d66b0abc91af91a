#!/bin/bash
# Sourced by the device scripts that A/B the MoE prefill GEMMs (x2_owed_check.sh,
# gate_up_parts_check.sh): moe_prefill_ab LABEL BINARY runs one moe_bench process timing the
# experts' GEMMs at 8,192 tokens for DeepSeek-V3, Kimi-K2.5 and Moonlight with the caller's
# environment (the patches' STRATA_* knobs: `STRATA_PIPE_X2=1 moe_prefill_ab x2 "$BIN"`), the log
# in $OUT/k_LABEL.log and its summary on stdout (the cuBLAS ceiling of the process, each config's
# "regimes agree" NMSE, the experts' µs and % of GEMM with gate_up and down); returns moe_bench's
# exit status (124: timed out after AB_TIMEOUT s, default 150). Uses the caller's t0 (date +%s).
moe_prefill_ab() {
  timeout "${AB_TIMEOUT:-150}" "$2" --what kernels --configs dsv3,kimi,moonlight --tokens 8192 \
    --sweep 0 >"$OUT/k_$1.log" 2>&1
  local rc=$?
  echo "[$1 @$(( $(date +%s) - t0 )) s] exit $rc $(grep -E '^ceiling +cuBLAS' "$OUT/k_$1.log" | cut -c10-60)"
  grep -oE "^moe +[a-z0-9-]+ +T=8192 .*regimes agree NMSE \S+" "$OUT/k_$1.log" | sed -E 's/ \|.*\|/:/'
  grep -E "experts prefill" "$OUT/k_$1.log" | sed -E 's/ +/ /g; s/[0-9]+ GB\/s = [0-9.]+% of copy //' |
    cut -c1-200
  return $rc
}
