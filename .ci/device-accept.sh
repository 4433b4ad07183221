#!/usr/bin/env bash
# Issue 27 (the host off the drafted path) on the H200, through the `device` tool (never CI): the device-accept CUDA
# tests, then the benches whose drafted rows run the device loop (kernels/accept.py) beside the host loop, each
# printing `device_accept ... frac_of_bound= host_frac_of_bound= ... ids_identical=`.
# Usage there: BLOOMERY_COMMIT=<sha> [STEPS="tests bench8 bench27w"] bash .ci/device-accept.sh   (carry .whl)
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-570} ))
source .ci/device-setup.sh || exit 2
R=${R_DIR:-$OUT/accept} && mkdir -p $R
device_info "accept" | tee $R/device.txt
for s in ${STEPS:-tests bench8 bench27w}; do
  case $s in
    tests) step tests 150 python3 -P -m pytest -q -p no:cacheprovider tests/test_accept.py tests/test_accept_bench.py \
             tests/test_chain.py
           tail -3 $R/tests.log ;;
    bench8) step bench8 ${B8_S:-200} python3 -P -m bloomery_cli.cli bench qwen3-dflash --shape qwen3-8b --device cuda \
              -n 256 --json $R/bench-qwen3-8b-cuda-bf16.json
            grep -E "^(plain|host|chain|drafted|device_accept|bound|criterion)" $R/bench8.log | cut -c1-220 ;;
    bench27w) step bench27w ${B27_S:-200} python3 -P -m bloomery_cli.cli bench qwen38-dflash2 --shape qwen38-27b \
                --layers 16 --device cuda -n 256 --json $R/bench-qwen38-27b-l16-dflash2-cuda-bf16.json
              grep -E "^(plain|host|chain|drafted|device_accept|bound|criterion)" $R/bench27w.log | cut -c1-220 ;;
    bench27m) step bench27m ${B27_S:-200} python3 -P -m bloomery_cli.cli bench qwen38-mtp --shape qwen38-27b \
                --mtp-width 3 --device cuda -n 256 --json $R/bench-qwen38-27b-mtp-cuda-bf16.json
              grep -E "^(plain|host|chain|drafted|device_accept|bound|criterion)" $R/bench27m.log | cut -c1-220 ;;
  esac
done
