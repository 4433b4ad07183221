#!/usr/bin/env bash
# Issue 27's MoE bench on the H200 (never CI), through the `device` tool (kind nvidia-h200):
#   bash .ci/device-moe27.sh            (carry .whl with the gguf wheel; BLOOMERY_COMMIT=<sha>)
# `bloomery bench moe` at Qwen3.6-35B-A3B (all 40 layers) and MiMo-V2-Flash (8 of 48 layers: 309 B weights do not
# fit one card), bf16, random weights made on the device; records, logs and plots under $OUT.
set -uo pipefail
N=${N:-64}; P=${P:-128}; T=${T:-100}; SHAPES=${SHAPES:-qwen35moe-35b-a3b mimo2-flash}
source .ci/device-setup.sh || exit 2
{ device_info; } | tee $OUT/device-moe27.txt
for s in $SHAPES; do
  timeout $T python3 -P -m bloomery_cli.bench moe --shape $s --device cuda --dtype bf16 -n $N --prompt-len $P \
    --json $OUT/bench-moe-$s-cuda-bf16.json > $OUT/bench-moe-$s-cuda-bf16.log 2>&1
  echo "$s exit $?"; grep -vE "^\[transformers\]" $OUT/bench-moe-$s-cuda-bf16.log | cut -c1-1200
done
