#!/bin/bash
# SGLang's multi-node flags on GPUs (issue 32), on a 2-GPU kind (nvidia-h200-x2), from the
# repository root: two "nodes" on this host, one GPU each (CUDA_VISIBLE_DEVICES), each running the
# same `strata serve --nnodes 2 --node-rank N --dist-init-addr 127.0.0.1:PORT` (NCCL's bootstrap
# through NCCL_COMM_ID). Greedy completions must equal the one-process tp 2 server's, without and
# with the host KV tier (whose per-rank messages then cross processes); SIGTERM to node 0 must stop
# both nodes. house-llama needs --tp-allow-uneven at tp 2. ~2-3 min with the build.
# Carry: .devcarry/cuda (house-llama). Logs go to $OUT.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
nvidia-smi -L
t0=$(date +%s)
dev_configure -DSTRATA_TESTS=OFF
dev_build strata
echo "build: $(( $(date +%s) - t0 )) s"
export NCCL_NVLS_ENABLE=0
M=$C/shared/models/house-llama
COMMON="--device cuda --model-path $M --tp-size 2 --tp-allow-uneven --mem-fraction-static 0.5 --max-total-tokens 4096"

wait_healthy() {  # port, seconds
  for _ in $(seq 1 $(( $2 * 5 ))); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    sleep 0.2
  done
  return 1
}
complete_all() {  # port, output file
  python3 - "$1" "$2" <<'PY'
import json, sys, urllib.request
port, out = sys.argv[1], sys.argv[2]
text = open("bench/RESULTS.md").read().replace("\n", " ")
res = []
for k in range(8):
    body = json.dumps({"prompt": text[k * 200:k * 200 + 300], "max_tokens": 24, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    res.append(json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["text"])
json.dump(res, open(out, "w"))
PY
}
same() { python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:3]); print(f'identical completions: {sum(x==y for x,y in zip(a,b))}/{len(a)}')" "$1" "$2"; }

./build-dev/strata serve $COMMON --port 31000 >"$OUT/single.log" 2>&1 &
single=$!
wait_healthy 31000 120 || { echo "single-process tp 2 did not start"; tail -20 "$OUT/single.log"; }
complete_all 31000 "$OUT/single.json"
kill -TERM $single; wait $single; echo "single-process tp 2: exit $?"

for tier in "" "--enable-hierarchical-cache --hicache-size 1"; do
  name=$([ -z "$tier" ] && echo plain || echo tier)
  CUDA_VISIBLE_DEVICES=0 ./build-dev/strata serve $COMMON $tier --port 31001 --nnodes 2 --node-rank 0 \
    --dist-init-addr 127.0.0.1:29511 >"$OUT/node0_$name.log" 2>&1 &
  n0=$!
  CUDA_VISIBLE_DEVICES=1 ./build-dev/strata serve $COMMON $tier --port 31001 --nnodes 2 --node-rank 1 \
    --dist-init-addr 127.0.0.1:29511 >"$OUT/node1_$name.log" 2>&1 &
  n1=$!
  if wait_healthy 31001 180; then
    complete_all 31001 "$OUT/nodes_$name.json"
    echo -n "two nodes ($name) vs one process: "; same "$OUT/single.json" "$OUT/nodes_$name.json"
    curl -s http://127.0.0.1:31001/metrics | grep -E "^strata_hicache_rank_(hit_tokens|bytes_to_host)" | head -4
  else
    echo "two nodes ($name) did not start"; tail -15 "$OUT/node0_$name.log" "$OUT/node1_$name.log"
  fi
  kill -TERM $n0; wait $n0; echo "node 0 launcher ($name): exit $?"
  wait $n1; echo "node 1 launcher ($name): exit $? (rank 0's shutdown message ends its ranks: 0 expected)"
  grep -hE "node . of 2|tensor parallel|Host KV tier|error" "$OUT/node0_$name.log" "$OUT/node1_$name.log" | head -12
done
echo "total: $(( $(date +%s) - t0 )) s"
