#!/usr/bin/env bash
# The plan against the H200, through the `device` tool (never by CI): for every fixture pair and the qwen3-8b and
# qwen38-27b shapes (random weights made on the card), `bloomery plan ... --measure` builds the engine at --ctx, prefills min(512, ctx/2) ids, drafts 32, and puts
# torch.cuda.max_memory_allocated beside the planned bytes (exit 1 past 5%). Records under $OUT/plan/ (copy them to
# results/h200/plan/ and commit). Usage (there): bash .ci/device-plan.sh   (carry .whl with the gguf wheel)
set -uo pipefail
source .ci/device-setup.sh || exit 2
R=$OUT/plan && mkdir -p $R
F=fixtures
run() { local name=$1; shift
  timeout ${PLAN_TIMEOUT:-300} python3 -P -m bloomery_cli.cli plan "$@" --device cuda --dtype bf16 --gpu-mem 130G \
    --measure --record $R/plan-$name.json 2>&1 | tee -a $R/plan.log; echo "$name exit ${PIPESTATUS[0]}" | tee -a $R/plan.log; }
if [ "${SET:-all}" = wave3 ]; then   # SET=wave3: the third wave's fixtures, each with its own MTP / NextN, at ctx 1000 and 300
  for f in qwen4exp-tiny glm5next-tiny ds4-tiny; do for c in 1000 300; do
    run $f-mtp-ctx$c $F/$f --draft $F/$f --ctx $c; done; done
  grep -E "exit|rel err" $R/plan.log; exit 0
fi
if [ "${SET:-all}" = ds41 ]; then   # SET=ds41: the V4.1 target (GGUF-only) with its V4.1 DSpark, at ctx 1000 and 300
  for c in 1000 300; do run ds41-tiny-dspark-b7-ctx$c $F/ds41-tiny/ds41-tiny.gguf --draft $F/ds41-tiny-dspark-b7.gguf \
    --ctx $c; done
  grep -E "exit|rel err" $R/plan.log; exit 0
fi
if [ "${SET:-all}" = all ]; then   # SET=new: only the fixtures added after the first H200 plan record
for d in qwen3-tiny-dflash-b8 qwen3-tiny-dflash2-b8 qwen3-tiny-dspark-b7 qwen3-tiny-eagle3; do
  run $d $F/qwen3-tiny --draft $F/$d --ctx 1000; done
run qwen38-tiny-mtp $F/qwen38-tiny --draft $F/qwen38-tiny --ctx 1000
for d in qwen38-tiny-dflash-b8 qwen38-tiny-dflash2-b8 qwen38-tiny-dspark-b7-speculators; do
  run $d $F/qwen38-tiny --draft $F/$d --ctx 1000; done
fi
run mimo2-tiny-mtp $F/mimo2-tiny --draft $F/mimo2-tiny --ctx 1000
run qwen35moe-tiny-mtp $F/qwen35moe-tiny --draft $F/qwen35moe-tiny --ctx 1000
run qwen35moe-tiny-dflash-b8 $F/qwen35moe-tiny --draft $F/qwen35moe-tiny-dflash-b8 --ctx 1000
for d in qwen3-tiny-dflash-b8-swa qwen3-tiny-dflash-b8-swa-speculators; do run $d $F/qwen3-tiny --draft $F/$d --ctx 1000; done
run qwen3yarn-tiny-dflash-b8 $F/qwen3yarn-tiny --draft $F/qwen3yarn-tiny-dflash-b8 --ctx 500
if [ "${SET:-all}" = all ]; then
for c in 4096 32768; do run qwen3-8b-ctx$c --shape qwen3-8b --ctx $c; done
for c in 4096 32768; do run qwen38-27b-ctx$c --shape qwen38-27b --ctx $c; done
fi
grep -E "exit|rel err" $R/plan.log
