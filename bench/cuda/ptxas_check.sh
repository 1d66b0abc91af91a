#!/bin/bash
# ptxas's verdict on the CUDA files that issue wgmma (or FILES...), here on the CPU machine: each
# file compiled alone with -Xptxas -v through its compile_commands.json entry (BUILD, default
# build-cuda: configure it once with the CUDA backend on), then per file the kernels ptxas
# serialized the wgmma of (`ptxas info (C7512) Potential Performance Loss: wgmma.mma_async
# instructions are serialized due to insufficient register resources`; CUDA 13's ptxas numbers the
# same line C7511, so the text is matched, not the number) and those that spill. It is an info
# line, not a warning: a build shows nothing, and the kernel runs correct but slower (2026-12-04:
# a persistent form of moe_experts_gemm_pipe.cu, several times; 2026-12-05: the weight-stationary
# down projection, 2-6%). Exit 1 if any kernel is serialized. Run it after changing a wgmma
# kernel, before spending device time on it.
set -u
B=${BUILD:-build-cuda}
[ -f "$B/compile_commands.json" ] || { echo "no $B/compile_commands.json"; exit 2; }
files=("$@")
[ ${#files[@]} -gt 0 ] || mapfile -t files < <(grep -l "wgmma" src/backend/cuda/*.cu)
bad=0
for f in "${files[@]}"; do
  cmd=$(python3 - "$B/compile_commands.json" "$(realpath "$f")" <<'PY'
import json, sys
for e in json.load(open(sys.argv[1])):
    if e["file"] == sys.argv[2]:
        print(e["command"])
        break
PY
)
  [ -n "$cmd" ] || { echo "$f: not in $B/compile_commands.json"; bad=1; continue; }
  cmd=$(sed 's| -o [^ ]*| -o /tmp/ptxas_check.o|' <<<"$cmd")
  out=$(cd "$B" && eval "$cmd -Xptxas -v" 2>&1) || {
    # A file that does not compile has no verdict (it once printed "0 serialized" here).
    echo "$f: does not compile"; grep -m5 "error" <<<"$out"; bad=1; continue
  }
  pat="wgmma.mma_async instructions are serialized"
  serial=$(grep -c "$pat" <<<"$out")
  spills=$(grep -cE "[1-9][0-9]* bytes spill stores" <<<"$out")
  # ptxas also injects warpgroup arrives where instructions touch wgmma registers after the fence
  # (C7519, an info line; e.g. accumulators rescaled after pv()'s fence): reported, not failed.
  injected=$(grep -c "warpgroup.arrive is injected" <<<"$out")
  echo "$f: $serial kernel(s) with serialized wgmma, $spills spilling, $injected injected warpgroup arrive(s)"
  grep "$pat" <<<"$out" | sed -E "s/.*(for|in) the function '?/  serialized: /" | cut -c1-160
  grep "warpgroup.arrive is injected" <<<"$out" | sed -E "s/.*in function '?/  injected: /" | sort | uniq -c | cut -c1-170
  [ "$serial" = 0 ] || bad=1
done
rm -f /tmp/ptxas_check.o
exit $bad
