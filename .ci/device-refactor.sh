#!/usr/bin/env bash
# Issue 24 (the registry, the layering, the family folders, one pipeline: behaviour must not move) on the H200, through
# the `device` tool (never CI): every gate in bf16 (records compared with the committed ones by
# .ci/compare_records.py), the two bench shapes (qwen3-8b, qwen38-27b dflash2 block 8) and the GPU-only tests.
# Usage there: BLOOMERY_COMMIT=<sha> [STEPS="gates gpu"] bash .ci/device-refactor.sh   (carry .whl: the gguf wheel)
# Steps (default all; the tool's 10 minutes hold two or three): gates, bench8, bench27, gpu.
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-570} ))
source .ci/device-setup.sh || exit 2
R=${R_DIR:-/tmp/refactor} && mkdir -p $R/gates
device_info "refactor" | tee $R/device.txt
for s in ${STEPS:-gates bench8 bench27 gpu}; do
  case $s in
    gates) step gates ${GATES_S:-420} python3 -P -m bloomery_cli.cli gates --device cuda --dtype bf16 --results $R/gates
           grep -E "^│" $R/gates.log | cut -c1-100
           python3 .ci/compare_records.py results/h200 $R/gates '*-cuda-bf16.json' | tee $R/compare.txt ;;
    bench8) step bench8 120 python3 -P -m bloomery_cli.cli bench qwen3-dflash --shape qwen3-8b --device cuda \
              --json $R/bench-qwen3-8b-cuda-bf16.json
            grep -E "^(plain|drafted|roofline|verify|host|chain)" $R/bench8.log | cut -c1-160 ;;
    bench27) step bench27 120 python3 -P -m bloomery_cli.cli bench qwen38-dflash2 --shape qwen38-27b --block 8 \
               --device cuda -n 256 --json $R/bench-qwen38-27b-dflash2-b8-cuda-bf16.json
             grep -E "^(plain|drafted|roofline|verify)" $R/bench27.log | cut -c1-160 ;;
    gpu) step gpu ${GPU_S:-90} python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/
         tail -3 $R/gpu.log ;;
  esac
done
mkdir -p $OUT && tar czf $OUT/refactor-$(echo ${STEPS:-all} | tr " " -).tgz -C $R . 2>/dev/null && echo "records in $OUT"
