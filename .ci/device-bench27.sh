#!/usr/bin/env bash
# The Qwen3.8-27B-shape hybrid benches on the H200 (never CI), through the `device` tool (kind nvidia-h200):
#   bash .ci/device-bench27.sh                 (carry .whl with the gguf wheel; N=256 LAYERS= HF=--hf by default)
# qwen38-dflash2 at B=8 and B=16 and qwen38-mtp (3 chained drafts), bf16, 512-token prompt, random weights made
# on the device; records and logs under $OUT (results/h200/ takes them). SMOKE=1 (default) first runs qwen38-dflash2
# and qwen38-mtp at --layers 4 -n 32 (the engine line shows which FastQwen38Target path ran, each failed path logged).
set -uo pipefail
N=${N:-256}; LAYERS=${LAYERS:-}; HF=${HF---hf}; T=${T:-200}
source .ci/device-setup.sh || exit 2
{ device_info
} | tee $OUT/device-bench27.txt
L=${LAYERS:+--layers $LAYERS}
smoke() {  # name tag args...: a 4-layer run at the 27B width first (SMOKE=0 skips), so an engine failure shows fast
  local name=$1 tag=$2; shift 2
  timeout 300 python3 -P -m bloomery_cli.bench.command $name --shape qwen38-27b --device cuda -n 32 --layers 4 "$@" \
    --json $OUT/bench-smoke-$tag-cuda-bf16.json > $OUT/bench-smoke-$tag-cuda-bf16.log 2>&1
  echo "smoke $tag exit $?"; grep -E "^(engine|plain|verify|draft|reference|ids identical)|Error" \
    $OUT/bench-smoke-$tag-cuda-bf16.log | cut -c1-400
}
if [ "${SMOKE:-1}" = 1 ]; then
  smoke qwen38-dflash2 l4-dflash2-b8 --block 8
  smoke qwen38-mtp l4-mtp --mtp-width 3
fi
run() {  # name tag args...
  local name=$1 tag=$2; shift 2
  timeout $T python3 -P -m bloomery_cli.bench.command $name --shape qwen38-27b --device cuda -n $N $L "$@" \
    --json $OUT/bench-$tag-cuda-bf16.json > $OUT/bench-$tag-cuda-bf16.log 2>&1
  echo "$tag exit $?"; grep -vE "^\[transformers\]" $OUT/bench-$tag-cuda-bf16.log | cut -c1-400
}
for step in ${STEPS:-dflash2-b8 mtp dflash2-b16}; do
  case $step in
    dflash2-b8) run qwen38-dflash2 qwen38-27b-dflash2-b8 --block 8 $HF ;;
    dflash2-b16) run qwen38-dflash2 qwen38-27b-dflash2-b16 --block 16 ;;
    mtp) run qwen38-mtp qwen38-27b-mtp --mtp-width 3 ;;
  esac
done
