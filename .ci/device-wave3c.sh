#!/usr/bin/env bash
# Issue 26's H200 leftovers in bf16, through the `device` tool (never CI): the gate ds41-dspark (V4.1 with its
# candidate mask; also with its draft on a device of its own), the MoE gates again with the choice lines of the
# state check and the end-to-end logits (routing_flips.state_choices), the deepseek41 CUDA tests, and the plan of
# ds41-tiny + its DSpark against the measured peak (device-plan.sh SET=ds41). Records under $OUT/wave3c.
# Usage there: BLOOMERY_COMMIT=<sha> [STEPS="..."] [GATES="..."] bash .ci/device-wave3c.sh   (carry .whl)
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-570} ))
source .ci/device-setup.sh || exit 2
begin wave3c
G="python3 -P -m bloomery_cli.cli gate run"
verdict() { grep -E "^(ids identical|accept_mean|PASSED|FAILED)|FAIL$" $R/$1.log | sort | uniq -c | cut -c1-160; }
for s in ${STEPS:-gates draftdev tests plan}; do
  case $s in
    gates) for g in ${GATES:-ds41-dspark glm5next-mtp qwen4exp-mtp ds4-dspark qwen35moe-mtp mimo2-mtp}; do
             step $g ${GATE_S:-100} $G $g --device cuda --dtype bf16 --json $R/$g-cuda-bf16.json; verdict $g; done ;;
    draftdev) step ds41-dspark-draftdev 120 $G ds41-dspark --device cuda --dtype bf16 --draft-device cuda:0 \
                --json $R/ds41-dspark-draftdev-cuda-bf16.json; verdict ds41-dspark-draftdev ;;
    tests) step ds41tests 120 python3 -P -m pytest -q -p no:cacheprovider tests/test_deepseek41.py \
             tests/test_deepseek41_candidates.py tests/test_state_choices.py -k "cuda or state or candidate"
           tail -3 $R/ds41tests.log ;;
    plan) SET=ds41 bash .ci/device-plan.sh > $R/plan.log 2>&1; grep -h "rel err" $R/plan.log $OUT/plan/*.log | cut -c1-200 ;;
  esac
done
