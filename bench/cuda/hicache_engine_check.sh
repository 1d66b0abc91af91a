#!/bin/bash
# Runs on the GPU machine from the repository root (carry .devcarry/cuda): the host KV tier through
# the real engine on CUDA. Six prompts (three chunks of bench/RESULTS.md, asked twice) through
# `strata generate --device cuda` on house-llama with a KV pool too small for all three
# (--max-total-tokens 1024), without and with the tier (both io backends); greedy outputs must
# be identical and the tier's summary line must show tokens served from host.
set -u
source bench/cuda/device_env.sh  # OUT, C, P, PKG; carried deps unpacked
t0=$(date +%s)
dev_configure -DSTRATA_TESTS=OFF
dev_build strata
echo "build: $(( $(date +%s) - t0 )) s"
python3 - "$OUT/prompts.jsonl" <<'PY'
import json, sys
text = open("bench/RESULTS.md").read().replace("\n", " ")
chunks = [text[i * 1400:(i + 1) * 1400] for i in range(3)]
with open(sys.argv[1], "w") as f:
    for r in range(2):
        for k, c in enumerate(chunks):
            f.write(json.dumps({"id": f"p{k}r{r}", "conversations": [{"role": "user", "content": c}]}) + "\n")
PY
run() {
  ./build-dev/strata generate --device cuda --model-path $C/shared/models/house-llama --input "$OUT/prompts.jsonl" \
    --max-new-tokens 24 --concurrency 1 --max-total-tokens 1024 --mem-fraction-static 0.5 --no-progress "$@"
}
run -o "$OUT/off.jsonl" 2>&1 | grep -E "KV cache|error" | tail -3
for io in kernel direct; do
  run -o "$OUT/on_$io.jsonl" --hicache-ratio 4 --hicache-write-policy write_back --hicache-io-backend $io 2>&1 \
    | grep -E "Host KV|error" | tail -3
  python3 - "$OUT/off.jsonl" "$OUT/on_$io.jsonl" <<'PY'
import json, sys
def load(p):
    return {r["id"]: r for r in map(json.loads, open(p))}
a, b = load(sys.argv[1]), load(sys.argv[2])
keys = sorted(a)
same = sum(a[k]["conversations"] == b[k]["conversations"] for k in keys)
print(f"identical outputs: {same}/{len(keys)}")
PY
done
