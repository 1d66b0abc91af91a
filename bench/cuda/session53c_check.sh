#!/bin/bash
# Prepared in session 53, not run (the device was paused): why the MLA query's proj form
# (bench/results/2026-12-07-session53-mla-query-proj-smem.patch) ended ~13.7 µs after kv_a's GEMV
# on an H100 where its q_proj bytes, loaded before its PDL wait, take ~4 µs at copy — and whether
# its forced largest shared-memory carveout is the cause (...-smem-no-carveout.patch: the same
# form with no carveout hint). Pack: `bash bench/cuda/prebuilt.sh pack s53c strata_bench_kit
# bench/results/2026-12-07-session53-mla-query-proj-smem.patch:strata_bench_kit
# bench/results/2026-12-07-session53-mla-query-proj-smem-no-carveout.patch:strata_bench_kit`;
# carry .devcarry/s53c (~41 MiB) and .devcarry/bench (configs and .debs; no fixture is read), the
# tree without tests/fixtures/hidden_states/*.safetensors (~57 MiB in all; with .devcarry/fxs it
# would pass 64). BUDGET_S: the call's limit (575 s).
#   1. On an H200: the rows owed since session 43 (prebuilt_h200_rows, main's kit), leaving 150 s.
#   2. Each patched kit: Moonlight batch 1, mla_query_proj against its defaults, alternating;
#      the no-carveout kit's run with both kernel listings (--timeline 2).
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/bench} source bench/cuda/device_env.sh
source bench/cuda/prebuilt.sh
PREBUILT=${PREBUILT:-s53c}
prebuilt_begin "$PREBUILT" "$C" || exit 1
prebuilt_h200_rows 150
for form in smem smem-no-carveout; do
  [ "$(prebuilt_left)" -gt 50 ] || break
  extra=""
  [ $form = smem-no-carveout ] && extra="--timeline 2 --timeline-variants mla_query_proj"
  timeout 70 "$BIN/2026-12-07-session53-mla-query-proj-${form}_strata_bench_kit" rank_step_bench \
    --config "$C/shared/configs/moonlight-16b-a3b/config.json" --batches 1 --context 768 \
    --prefill 0 --reps 100 --variants mla_query_proj,defaults,mla_query_proj $extra \
    >"$OUT/moonlight_$form.log" 2>&1
  echo "moonlight ($form): exit $?"
  grep -E "^decode|^variant|^timeline" "$OUT/moonlight_$form.log" | cut -c1-200
done
prebuilt_end session53c_check
