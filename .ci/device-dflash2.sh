#!/usr/bin/env bash
# Issue 27 (the DFlash2 draft's step at its bytes) on the H200, through the `device` tool (never CI): the CUDA tests of
# the fast DFlash2 draft and its Triton selector / top-K, the gemv tiles of the draft's own narrow weights, the 27B
# width bench with the draft's profile block (its kernels per propose), and the same bench on the measured tiles.
# Usage there (two calls: each stays under the 570 s of one): BLOOMERY_COMMIT=<sha> [STEPS="tests bench27w"] bash
# .ci/device-dflash2.sh, then STEPS="gemv bench27w_tiles" (carry .whl)
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-570} ))
source .ci/device-setup.sh || exit 2
begin dflash2
B27="python3 -P -m bloomery_cli.cli bench qwen38-dflash2 --shape qwen38-27b --layers 16 --device cuda -n 256"
show() { grep -E "^(plain|verify|draft|bound|drafted|device_accept|criterion|profile draft|ids)" $1 | cut -c1-220; }
for s in ${STEPS:-tests bench27w}; do
  case $s in
    tests) step tests 150 python3 -P -m pytest -q -p no:cacheprovider tests/test_dflash2_fast.py \
             tests/test_selector_triton.py tests/test_dflash2.py tests/test_accept.py tests/test_accept_bench.py
           tail -3 $R/tests.log ;;
    gemv) step gemv 120 python3 -P -m bloomery_cli.bench.gemv --shape qwen38-27b-dflash2 --rows 8 --rows 16 \
            --json $R/gemv-dflash2-cuda-bf16.json --write-configs $R/gemv-dflash2.json
          grep -E "^gemv|^configs" $R/gemv.log | cut -c1-220 ;;
    bench27w) step bench27w ${B27_S:-200} $B27 --profile --json $R/bench-qwen38-27b-l16-dflash2-cuda-bf16.json
              show $R/bench27w.log ;;
    bench27w_tiles) [ -s $R/gemv-dflash2.json ] || { echo "bench27w_tiles skipped: no $R/gemv-dflash2.json"; continue; }
                    BLOOMERY_GEMV_CONFIGS=$R/gemv-dflash2.json step bench27w_tiles ${B27_S:-200} $B27 \
                      --json $R/bench-qwen38-27b-l16-dflash2-tiles-cuda-bf16.json
                    show $R/bench27w_tiles.log ;;
  esac
done
