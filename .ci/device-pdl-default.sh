#!/usr/bin/env bash
# Issue 27 on the H200 through the `device` tool (never CI), one call: PDL on by default (kernels/triton/pdl_policy.py
# DEFAULT), every fast-engine gate under it, the fast paths' unit tests, and the benches it changes.
#   BLOOMERY_COMMIT=<sha> [STEPS="gates tests chain q8 b27"] bash .ci/device-pdl-default.sh        (carry .whl)
# gates  bloomery gates --engine fast --device cuda --dtype bf16 (records under $OUT/fast: results/h200/fast/)
# tests  the Triton / graphed-engine tests on CUDA (test_pdl among them: the default named on this card)
# chain  bench.chain at qwen3-8b (K = 8, 16) with the default, then with BLOOMERY_PDL=off: one call, one card
# q8     bench qwen3-dflash at qwen3-8b (plain, chain, verify, drafted, device accept against the bound)
# b27    bench qwen38-mtp at the 27B width, 16 layers, MTP x3
# Logs and bench records: $OUT/speed (results/h200/speed/<sha>-pdl-default).
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-585} ))
source .ci/device-setup.sh || exit 2
R_DIR=$OUT/fast begin fast
S=$OUT/speed && mkdir -p $S && cp $R/device.txt $S/
for s in ${STEPS:-gates tests chain q8 b27}; do
  case $s in
    gates) step gates ${GATES_S:-200} python3 -P -m bloomery_cli.cli gates --engine fast --device cuda --dtype bf16 \
             --results $R; grep -E "^(PASSED|FAILED)|│" $R/gates.log | cut -c1-120 | head -20 ;;
    tests) step tests ${TESTS_S:-120} python3 -P -m pytest -q -p no:cacheprovider tests/test_pdl.py tests/test_qwen38_fast.py \
             tests/test_mtp_fast.py tests/test_dflash2_fast.py tests/test_gemv.py tests/test_bench.py tests/test_chain.py
           tail -3 $R/tests.log | cut -c1-200 ;;
    chain) for p in default off; do
             R=$S step chain8-$p 60 env BLOOMERY_PDL=$([ $p = off ] && echo off) python3 -P -m bloomery_cli.bench.chain \
               --shape qwen3-8b --device cuda -n 256 --k 8,16 --json $S/bench-chain-qwen3-8b-$p-cuda-bf16.json
             grep -E "^(plain|chain|device)" $S/chain8-$p.log | cut -c1-200; done ;;
    q8) R=$S step q8 ${Q8_S:-150} python3 -P -m bloomery_cli.bench.command qwen3-dflash --shape qwen3-8b --device cuda -n 256 \
          --json $S/bench-qwen3-8b-cuda-bf16.json
        grep -E "^(plain|chain k=16|bound|device_accept|criterion)|Error" $S/q8.log | cut -c1-250 ;;
    b27) R=$S step b27 100 python3 -P -m bloomery_cli.bench.command qwen38-mtp --shape qwen38-27b --layers 16 \
           --mtp-width 3 --device cuda -n 128 --json $S/bench-qwen38-27b-l16-mtp-cuda-bf16.json
         grep -E "^(plain|chain k=16|bound|device_accept)|Error" $S/b27.log | cut -c1-250 ;;
  esac
done
