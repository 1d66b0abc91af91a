#!/bin/bash
# fp8_flashmla decode rows at batch 64 x 4,096 read 65% of copy on an H100 and 79% at batch 128
# (session 44): read linearly ~32 us of a 88 us call would not be streaming, or the S warps bound
# each chunk (~2.5 us a 64-key chunk). Which: `mla_bench --what
# ceilings,fp8split` — the acceptance shape against batch 128 / context 8,192 / batch 32 x 8,192 /
# 256 x 1,024, split counts 1 / 3 / 4 / 8, loads alone and math alone (diag 1 / 2, with the wait
# profile), pages shuffled and in pool order, 16 and 8 heads — then `--what scaling`, the same over
# bf16 rows, in the same process (RUNS processes). From a prebuilt pack (carry .devcarry/PREBUILT
# and .devcarry/fxs): bash bench/cuda/prebuilt.sh pack NAME strata_bench_kit.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-k48}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
for i in $(seq 1 "${RUNS:-2}"); do
  timeout 240 "$PB/strata_bench_mla_bench" --what ceilings,fp8split,scaling >"$OUT/mla_fp8_$i.log" 2>&1
  echo "[mla $i @$(( $(date +%s) - t0 )) s] exit $?"
  grep -E "^ceiling|^mla|^prof" "$OUT/mla_fp8_$i.log" | sed 's/ of latent rows//' | cut -c1-200 | head -60
done
