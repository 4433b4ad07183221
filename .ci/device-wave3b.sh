#!/usr/bin/env bash
# The third wave's second half on the H200 in bf16, through the `device` tool (never CI): the new gate ds4-dspark
# (also with its draft on a device of its own, --draft-device), the GGUF trunks (qwen4exp-mtp, glm5next-mtp, ds4-mtp
# from their bundled GGUFs), the plan of the deepseek4 fixtures (the MTP and the DSpark draft) against the measured
# peak, and the DFlash2 draft's fast path (its CUDA tests and the 27B-width bench). Records under $OUT/wave3b.
# Usage there: BLOOMERY_COMMIT=<sha> [STEPS="..."] [GATES="..."] bash .ci/device-wave3b.sh   (carry .whl)
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-570} ))
source .ci/device-setup.sh || exit 2
begin wave3b
G="python3 -P -m bloomery_cli.cli gate run"
verdict() { grep -E "^(ids identical|accept_mean|PASSED|FAILED)|FAIL$" $R/$1.log | cut -c1-160; }
for s in ${STEPS:-gates draftdev gguf plan d2tests bench27w}; do
  case $s in
    gates) for g in ${GATES:-ds4-dspark}; do
             step $g ${GATE_S:-150} $G $g --device cuda --dtype bf16 --json $R/$g-cuda-bf16.json; verdict $g; done ;;
    draftdev) step ds4-dspark-draftdev 150 $G ds4-dspark --device cuda --dtype bf16 --draft-device cuda:0 \
                --json $R/ds4-dspark-draftdev-cuda-bf16.json; verdict ds4-dspark-draftdev ;;
    gguf) step qwen4exp-gguf 120 $G qwen4exp-mtp --target fixtures/qwen4exp-tiny.gguf --device cuda --dtype bf16 \
            --json $R/qwen4exp-mtp-gguf-cuda-bf16.json; verdict qwen4exp-gguf
          step glm5next-gguf 120 $G glm5next-mtp --target fixtures/glm5next-tiny.gguf --draft fixtures/glm5next-tiny.gguf \
            --device cuda --dtype bf16 --json $R/glm5next-mtp-gguf-cuda-bf16.json; verdict glm5next-gguf
          step ds4-gguf 120 $G ds4-mtp --target fixtures/ds4-tiny-lc.gguf --draft fixtures/mtp-ds4-tiny-lc.gguf \
            --device cuda --dtype bf16 --json $R/ds4-mtp-gguf-cuda-bf16.json; verdict ds4-gguf ;;
    plan) for c in 1000 300; do
            step plan-ds4-mtp-$c 60 python3 -P -m bloomery_cli.cli plan fixtures/ds4-tiny --draft fixtures/ds4-tiny \
              --device cuda --dtype bf16 --ctx $c --gpu-mem 130G --measure --record $R/plan-ds4-tiny-mtp-ctx$c.json
            step plan-ds4-dspark-$c 60 python3 -P -m bloomery_cli.cli plan fixtures/ds4-tiny \
              --draft fixtures/ds4-tiny-dspark-b7.gguf --device cuda --dtype bf16 --ctx $c --gpu-mem 130G --measure \
              --record $R/plan-ds4-tiny-dspark-ctx$c.json
          done; grep -h "rel err" $R/plan-*.log | cut -c1-200 ;;
    d2tests) step d2tests 150 python3 -P -m pytest -q -p no:cacheprovider tests/test_dflash2_fast.py \
               tests/test_selector_triton.py tests/test_dflash2.py tests/test_accept.py tests/test_accept_bench.py
             tail -3 $R/d2tests.log ;;
    bench27w) step bench27w ${B27_S:-150} python3 -P -m bloomery_cli.cli bench qwen38-dflash2 --shape qwen38-27b \
                --layers 16 --device cuda -n 256 --json $R/bench-qwen38-27b-l16-dflash2-cuda-bf16.json
              grep -E "^(plain|chain|bound|drafted|device_accept|criterion)" $R/bench27w.log | cut -c1-230 ;;
  esac
done
