#!/bin/bash
# Checks wip/struct's moves on the GPU machine (issue 21's structure rules and the duplicates
# folded), from the repository root; carry .devcarry/mla (house-mla for MlaModel; with
# .devcarry/cuda the MlaModel cases are left out). Nothing was meant to change
# what the GPU computes, so every stage compares against an existing bound or record:
#   1. build strata_parity_test and strata_bench_mla_bench (tests ON: the first build of a call);
#   2. parity, one process per group (into its own log):
#      mla  MlaAttention.*, MlaBackend.*, MlaDcp.*, *MlaModel*: the MLA decode kernel split into
#           its S-warp and PV-warp headers (mla_decode_{s,pv}_warps.cuh), and the backend / DCP /
#           model tests now sharing tests/parity/mla_sequences.h;
#      moe  MoeParity.*, MoeBackend.*, Int4Parity.*: tests/support/device_buffer.h shared by the
#           MoE and INT4 kernel tests; launch.h's PerDeviceOnce and num_sms in the INT4 / MoE
#           launchers; the INT4 / MoE GEMMs on attention_wgmma.cuh's wrappers (SASS byte-identical);
#           the INT4 register / stream GEMVs' shared epilogue (register SASS identical, stream the
#           same instruction counts and registers);
#      ops  CudaParity.Linear*, CudaParity.PerHeadLinear*, TreeParity.PagedAttentionDeterministic:
#           linear.cu's GemmOperands filling both GEMMs' parameters (cuBLAS and batch-invariant),
#           with the new deterministic-mode cases; TreeParity.KvMoveRows: kv_move's own op id;
#           CudaParity.PrefillAttention*: attention_wgmma.cuh, now also the INT4 / MoE GEMMs' (their
#           SASS byte-identical; Int4Parity / MoeParity above run those GEMMs);
#   3. the MLA decode kernel's speed: strata_bench_mla_bench --what ceilings,acceptance, twice
#      (bf16 and fp8_flashmla at 16 / 8 / 128 heads, batch 64 x 4,096), against bench/RESULTS.md's
#      74.9 / 79.2% of copy (bf16, 16 / 8 heads) and 39.6 / 44.8% (fp8_flashmla); the split
#      changed the kernels' SASS by 0 to +56 instructions of ~4,600-8,300 (same registers).
# Well under 3 minutes after the build. Logs: one tarball, $OUT/struct_check_logs.tar.gz.
set -u
[ -z "${STRATA_CARRY:-}" ] && [ -d .devcarry/mla ] && export STRATA_CARRY=$PWD/.devcarry/mla
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build; carried deps unpacked
L=/tmp/struct_check_logs
rm -rf $L && mkdir -p $L
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_mla_bench
echo "build: $(( $(date +%s) - t0 )) s"
cp "$OUT/cmake.log" "$OUT/build.log" $L/ 2>/dev/null
rm -f "$OUT/cmake.log" "$OUT/build.log"

mla='MlaAttention.*:MlaBackend.*:MlaDcp.*:*MlaModel*'
if [ ! -d "$C/shared/models/house-mla" ]; then  # the cuda carry: MlaModel needs house-mla
  mla='MlaAttention.*:MlaBackend.*:MlaDcp.*'
  echo "no house-mla in $C: MlaModel not run (carry .devcarry/mla for it)"
fi
dev_parity mla "$mla" 200
dev_parity moe 'MoeParity.*:MoeBackend.*:Int4Parity.*' 150
dev_parity ops 'CudaParity.Linear*:CudaParity.PerHeadLinear*:CudaParity.PrefillAttention*:TreeParity.PagedAttentionDeterministic:TreeParity.KvMoveRows' 120
# The worst case of the decode kernel (bound 1e-4) and of the deterministic GEMMs (1e-5): NMSE last.
worst() {  # worst FILE PATTERN
  grep -E "$2" "$1" | awk '{ v = ($NF == "inf" || $NF == "nan") ? 1e300 : $NF + 0;
    if (n == 0 || v > m) { m = v; line = $0 } n++ } END { if (n) print n " cases, worst: " line }'
}
echo "decode kernel: $(worst "$L/parity_mla.log" '^mla attention .* decode  *kernel')"
echo "deterministic: $(worst "$L/parity_ops.log" 'deterministic')"

for run in 1 2; do
  t1=$(date +%s)
  timeout 75 ./build-dev/strata_bench_mla_bench --what ceilings,acceptance >"$L/mla_accept_$run.log" 2>&1
  echo "mla_bench acceptance run $run: exit status $?, $(( $(date +%s) - t1 )) s"
  grep -E "^ceiling" "$L/mla_accept_$run.log" | head -2
  grep -E "^mla " "$L/mla_accept_$run.log" | sed -E 's/^mla +accept +//; s/batch 64 x ctx  4096, +1 new, //; s/ +[0-9]+ rows, +[0-9]+ split\(s\)//'
done
echo "RESULTS.md: bf16 74.9 / 79.2% of copy at 16 / 8 heads; fp8_flashmla 39.6 / 44.8%"
tar czf "$OUT/struct_check_logs.tar.gz" -C /tmp struct_check_logs
echo "total: $(( $(date +%s) - t0 )) s; logs in struct_check_logs.tar.gz"
