#!/usr/bin/env bash
# Issue 27 on the H200 (never CI), through the `device` tool (kind nvidia-h200):
#   bash .ci/device-moe27.sh            (carry .whl with the gguf wheel; BLOOMERY_COMMIT=<sha>)
# 1. bench_chain at qwen3-8b: the plain loop's host share of an id, and K chained plain steps a graph replay
#    (K = 8, 16), ids against the plain loop (exit 1 if they differ);
# 2. `bloomery bench moe` at Qwen3.6-35B-A3B (all 40 layers) and MiMo-V2-Flash (8 of 48 layers: 309 B weights do
#    not fit one card), bf16, random weights made on the device; records, logs and plots under $OUT.
set -uo pipefail
N=${N:-64}; P=${P:-128}; T=${T:-80}; REPS=${REPS:-9}; SHAPES=${SHAPES:-qwen35moe-35b-a3b mimo2-flash}
source .ci/device-setup.sh || exit 2
{ device_info; } | tee $OUT/device-moe27.txt
if [ "${CHAIN:-1}" = 1 ]; then
  timeout 60 python3 -P -m bloomery_cli.bench.chain --shape qwen3-8b --device cuda -n 256 --k 8,16 \
    --json $OUT/bench-chain-qwen3-8b-cuda-bf16.json > $OUT/bench-chain-qwen3-8b-cuda-bf16.log 2>&1
  echo "chain exit $?"; cut -c1-400 $OUT/bench-chain-qwen3-8b-cuda-bf16.log | tail -12
fi
for s in $SHAPES; do
  timeout $T python3 -P -m bloomery_cli.bench.command moe --shape $s --device cuda --dtype bf16 -n $N --prompt-len $P \
    --reps $REPS --json $OUT/bench-moe-$s-cuda-bf16.json > $OUT/bench-moe-$s-cuda-bf16.log 2>&1
  echo "$s exit $?"; grep -vE "^\[transformers\]" $OUT/bench-moe-$s-cuda-bf16.log | cut -c1-1500
done
