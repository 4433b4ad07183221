#!/usr/bin/env bash
# Issue 27 (the host off the plain path) on the H200, through the `device` tool (never CI): the chain's CUDA tests,
# then the bench at both dense shapes, each printing the host share of a plain id and the chained decode (K 8, 16).
# Usage there: BLOOMERY_COMMIT=<sha> [STEPS="tests bench27 bench8"] bash .ci/device-chain.sh   (carry .whl)
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-570} ))
source .ci/device-setup.sh || exit 2
R=${R_DIR:-$OUT/chain} && mkdir -p $R
device_info "chain" | tee $R/device.txt
for s in ${STEPS:-tests bench27 bench8}; do
  case $s in
    tests) step tests 150 python3 -P -m pytest -q -p no:cacheprovider tests/test_chain.py tests/test_qwen38_fast.py
           tail -3 $R/tests.log ;;
    bench27) step bench27 ${B27_S:-200} python3 -P -m bloomery_cli.cli bench qwen38-mtp --shape qwen38-27b \
               --mtp-width 3 --device cuda -n 256 --json $R/bench-qwen38-27b-mtp-cuda-bf16.json
             grep -E "^(engine|plain|host|chain|drafted|bound|criterion|ids)" $R/bench27.log | cut -c1-160 ;;
    bench8) step bench8 120 python3 -P -m bloomery_cli.cli bench qwen3-dflash --shape qwen3-8b --device cuda \
              --json $R/bench-qwen3-8b-cuda-bf16.json
            grep -E "^(plain|host|chain|drafted|bound)" $R/bench8.log | cut -c1-160 ;;
  esac
done
