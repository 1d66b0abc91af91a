#!/bin/bash
# The MLA decode kernel's bandwidth passes (issue 22) on the GPU machine (the device tool), from the
# repository root, unattended, < 4 minutes:
#   1. builds strata_parity_test and strata_bench_mla_bench (Release, build-dev);
#   2. the MLA parity tests against the CPU twin: first the V tile's cases alone
#      (MlaAttention.DecodeVTile: e4m3 values converted once into a shared f16 tile, cvt 3), then
#      the rest (MlaAttention.*: every row format and kernel, the decode kernel's three stage
#      layouts and prefetch distances; MlaBackend.*: the backend's entry points, graph replay;
#      MlaDcp.*: the shard mode's partials); their verdict decides how the benchmark's numbers may
#      be read and which changes the acceptance rows keep (printed before them);
#   3. the ceilings (copy bandwidth, bf16 GEMM rate), the old-vs-new sweep of the decode kernel
#      (`--what variants`: old = one row a copy and no prefetch, new = the product's default, and
#      groups of 8 rows, 4 stages, the V tile, loads-only / math-only / no-S-math / no-PV-math
#      runs) with one summary line a layout and head count and one short line a variant, then
#      issue 22's decode rows with the product's plans (`--what acceptance`: bf16 and
#      fp8_flashmla at 16, 8, 128 heads), each its own process (a fault in one leaves the other);
#   4. the PyTorch baseline of the same decode (bench/cuda/mla_torch_baseline.py).
# Logs go to $OUT (mla_decode_vtile.log, mla_decode_parity.log, mla_decode_variants.log,
# mla_decode_accept.log, mla_decode_torch.log). Carry: .devcarry/cuda, as the other bench/cuda
# scripts.
# Knobs: PARITY_FILTER (default MlaAttention.*:MlaBackend.*:MlaDcp.* but the V tile's cases,
# which run first on their own), BUILD=0 (reuse build-dev), TORCH=0.
set -u
source bench/cuda/device_env.sh  # OUT, C, P, PKG; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv,noheader
t0=$(date +%s)
if [ "${BUILD:-1}" = 1 ]; then
  dev_configure
  dev_build strata_parity_test strata_bench_mla_bench
fi
echo "build: $(( $(date +%s) - t0 )) s"

# The V tile's cases (a new pipeline: a hang or a fault there must not take the others down) run
# on their own; they decide whether the bench times the V-tile variants.
timeout 90 ./build-dev/strata_parity_test --gtest_filter="MlaAttention.DecodeVTile" \
  >"$OUT/mla_decode_vtile.log" 2>&1
trc=$?
vbad=$(grep "^mla attention .* decode  *kernel" "$OUT/mla_decode_vtile.log" |
  awk '{ if ($NF == "inf" || $NF == "nan" || $NF + 0 >= 1e-4) print }' | head -10)
echo "V tile parity (MlaAttention.DecodeVTile): exit status $trc, $(grep -c "decode  *kernel" \
  "$OUT/mla_decode_vtile.log") cases, $(( $(date +%s) - t0 )) s"
[ -n "$vbad" ] && echo "$vbad"
vtile=1
[ $trc != 0 ] && vtile=0 && echo "V TILE PARITY FAILED OR HUNG: no V-tile variants"
filter=${PARITY_FILTER:-MlaAttention.*:MlaBackend.*:MlaDcp.*-MlaAttention.DecodeVTile}
timeout 150 ./build-dev/strata_parity_test --gtest_filter="$filter" >"$OUT/mla_decode_parity.log" 2>&1
rc=$?
grep -E "^\[ *(OK|FAILED|PASSED) *\]|Failure|Expected|Which is|kernel decode|kernel mma|kernel wgmma" \
  "$OUT/mla_decode_parity.log" | tail -40
bad=$(grep "^mla attention .* decode  *kernel" "$OUT/mla_decode_parity.log" |
  awk '{ if ($NF == "inf" || $NF == "nan" || $NF + 0 >= 1e-4) print }')
fails=$(grep -c "^\[  FAILED  \] Mla" "$OUT/mla_decode_parity.log")
echo "parity: exit status $rc, $fails failed test(s), $(( $(date +%s) - t0 )) s"
# The acceptance rows run without a change whose parity cases failed (the printed case lines name
# the knobs: "prefetch N, row group G" with G the rows a copy); after a hang or a crash, as the
# kernel was before both.
flags="" vt=170
if [ $rc = 124 ] || ! grep -q "^\[==========\] .* ran\." "$OUT/mla_decode_parity.log"; then
  echo "PARITY HUNG OR CRASHED (a hang: most likely a stage whose copies do not match its expected"
  echo "bytes): acceptance rows with --row-groups 0 --l2-prefetch 0"
  flags="--row-groups 0 --l2-prefetch 0" vt=60
elif [ -n "$bad" ]; then
  echo "decode kernel cases over the 1e-4 bound:"
  echo "$bad" | head -20
  if ! echo "$bad" | grep -qv "row group 8"; then
    flags="--row-groups 1"
  elif ! echo "$bad" | grep -qv "row group [48]"; then
    flags="--row-groups 0"
  elif ! echo "$bad" | grep -qv "prefetch [1-9]"; then
    flags="--l2-prefetch 0"
  else
    flags="--decode-kernel 0"
  fi
  echo "PARITY FAILED for the decode kernel: acceptance rows with $flags; the variants below time"
  echo "wrong results for the failing change"
elif [ $rc != 0 ]; then
  echo "PARITY FAILED, but no MlaAttention decode-kernel case (see the log: an MlaBackend case at"
  echo "512 + 64 dims runs the decode kernel too; then its numbers below may time wrong results)"
fi

B=./build-dev/strata_bench_mla_bench
timeout $vt $B --what ceilings,variants --vtile $vtile 2>&1 | tee "$OUT/mla_decode_variants.log" |
  grep -E "^(device|ceiling|summary)"
vrc=${PIPESTATUS[0]}
# Every variant of bf16 and FlashMLA rows at 16 and 8 heads as one short line: layout, heads,
# variant, kernel config, % of copy (all of them: mla_decode_variants.log).
grep -E "^mla .*(bf16|fp8_flashmla) .* (16|  8) heads" "$OUT/mla_decode_variants.log" | awk '/^mla /{ split($0, a, ":"); cfg = a[1]; sub(/.*heads, /, "", cfg); sub(/ +[0-9]+ rows,.*/, "", cfg);
  match($0, /= +[0-9.]+% of copy/); c = substr($0, RSTART + 2, RLENGTH - 10);
  printf "%-12s %3s h %-12s %-34s %7s\n", $3, $11, $2, cfg, c }'
echo "variants: exit status $vrc, $(( $(date +%s) - t0 )) s"
timeout 60 $B --what ceilings,acceptance $flags 2>&1 | tee "$OUT/mla_decode_accept.log"
echo "acceptance ($flags): exit status ${PIPESTATUS[0]}, $(( $(date +%s) - t0 )) s"
[ "${TORCH:-1}" = 1 ] && timeout 60 python3 bench/cuda/mla_torch_baseline.py 2>&1 | tee "$OUT/mla_decode_torch.log"

echo "==== where the decode kernel's warps wait, 16 heads (cycles a chunk of one warp) ===="
grep "^prof .* 16 heads" "$OUT/mla_decode_variants.log" | sed 's/^prof *//; s/ heads, cycles\/chunk//'
echo "==== old -> new (the decode kernel, batch 64 x 4,096, % of copy bandwidth) ===="
grep "^summary" "$OUT/mla_decode_variants.log"
echo "parity: exit status $rc ($fails failed)"
echo "total: $(( $(date +%s) - t0 )) s"
