#!/usr/bin/env bash
# Real-size, real-layout gates on the H200 (random weights written by bloomery_cli.fixturegen.real_layout):
#   SHAPE=qwen3-8b   : Qwen3-8B (5 shards + index) + a 5-layer z-lab DFlash-b16 drafter -> gate qwen3-dflash
#   SHAPE=qwen38-27b : the Qwen3.8-27B hybrid at real width, LAYERS of its 64 layers (disk and the device time),
#                      MTP head in-file + a 5-layer DFlash2 B=8 drafter -> gates qwen38-dflash2, qwen38-mtp
# Each gate's record (cost line: wall seconds per phase, peak host RSS, peak device memory) lands in $OUT.
# Usage (there): BLOOMERY_COMMIT=<sha> SHAPE=qwen3-8b bash .ci/device-real.sh   (carry .whl with the gguf wheel)
set -uo pipefail
source .ci/device-setup.sh || exit 2
SHAPE=${SHAPE:-qwen3-8b}; N=${N:-32}; W=/tmp/ck/$SHAPE
{ device_info "shape $SHAPE layers ${LAYERS:-all} n $N"; df -h /tmp | tail -1; free -g | head -2
} | tee $OUT/device-$SHAPE.txt
t0=$(date +%s)
python3 -P -m bloomery_cli.fixturegen.real_layout $SHAPE $W ${LAYERS:+--layers $LAYERS} --device cuda 2>&1 \
  | tee $OUT/write-$SHAPE.log | tail -4
echo "write_s $(( $(date +%s) - t0 ))" | tee -a $OUT/write-$SHAPE.log
gate() {   # name draft-dir
  timeout ${GATE_TIMEOUT:-420} python3 -P -m bloomery_cli.cli gate run $1 --target $W/target --draft $2 \
    --prompts $W/prompts.jsonl -n $N --device cuda --dtype bf16 --json $OUT/$1-$SHAPE-real.json \
    > $OUT/$1-$SHAPE-real.log 2>&1
  echo "$1 exit $?" | tee -a $OUT/$1-$SHAPE-real.log
  grep -vE "^\(r\) (layer|state)|^\(r\) .* layer [0-9]+ " $OUT/$1-$SHAPE-real.log | tail -14
}
if [ "$SHAPE" = qwen3-8b ]; then gate qwen3-dflash $W/dflash-b16
else gate qwen38-dflash2 $W/dflash2-b8; gate qwen38-mtp $W/target; fi
rm -rf /tmp/ck
