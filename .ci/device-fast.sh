#!/usr/bin/env bash
# Issue 29 part 4 on the H200 through the `device` tool (never CI), one call under the tool's 10 minutes:
#   BLOOMERY_COMMIT=<sha> [STEPS="gates"] bash .ci/device-fast.sh          (carry: .whl, the gguf wheel)
# gates    bloomery gates --engine fast --device cuda --dtype bf16: every pair the fast engine supports
#          (bloomery_cli/fast_engine.py: FastQwen3Target / FastQwen38Target and their fast drafts, Triton ops and
#          CUDA graphs, the engines `bloomery bench` measures) under every line of the gate; the pairs it does not
#          support are listed n/a with the reason. One record per gate, <gate>-fast-cuda-bf16.json.
# tests    the fast paths' own unit tests, which run on CUDA where it is (Triton kernels, graphs), for the log.
# Records: $OUT/results/h200/fast/ (the lead commits them there), logs beside them.
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-575} ))
source .ci/device-setup.sh || exit 2
R=$OUT/results/h200/fast && mkdir -p $R
device_info "fast" | tee $R/device.txt
for s in ${STEPS:-gates tests}; do
  case $s in
    gates) step gates ${GATES_S:-420} python3 -P -m bloomery_cli.cli gates --engine fast --device cuda --dtype bf16 \
             --results $R; tail -30 $R/gates.log | cut -c1-200 ;;
    tests) step tests ${TESTS_S:-150} python3 -P -m pytest -q -p no:cacheprovider tests/test_qwen38_fast.py \
             tests/test_mtp_fast.py tests/test_dflash2_fast.py tests/test_deltanet_fast.py tests/test_gemv.py \
             tests/test_norm_rope.py
           tail -5 $R/tests.log | cut -c1-200 ;;
  esac
done
grep -hE "^(load|PASSED|FAILED|accept_mean)" $R/gates.log 2>/dev/null | cut -c1-240
