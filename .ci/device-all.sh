#!/usr/bin/env bash
# Everything that needs the H200, in one call of the `device` tool (never CI): the bf16 gates, the Qwen3-8B-shape
# decode bench (roofline, verify cost, drafted speed, HF peer), the GPU-only tests, the bench on the fixtures.
# Each step has its own time limit and writes under $OUT as soon as it ends, so a cut run keeps what it measured.
# Usage there: BLOOMERY_COMMIT=<sha> bash .ci/device-all.sh        (carry .whl with the gguf wheel)
set -uo pipefail
source .ci/device-setup.sh || exit 2
R=/tmp/h200 && mkdir -p $R
{ device_info
} > $R/device.txt
cat $R/device.txt
# 1. every registered gate in bf16 (records + log), packed at once
timeout 280 python3 -P -m bloomery_cli.cli gates --device cuda --dtype bf16 --results $R > $R/gates-cuda-bf16.log 2>&1
echo "gates exit $?" | tee -a $R/gates-cuda-bf16.log
grep -E "^(PASSED|FAILED)|^ids identical|^accept_mean|FAIL$|^│" $R/gates-cuda-bf16.log
tar -C /tmp -cf $OUT/gates.tar h200
# 2. decode speed at the Qwen3-8B shape (the record is saved after every stage)
timeout 150 python3 -P -m bloomery_cli.bench.command qwen3-dflash --shape qwen3-8b --device cuda \
  --json $OUT/bench-qwen3-8b-cuda-bf16.json > $OUT/bench-qwen3-8b-cuda-bf16.log 2>&1; echo "bench exit $?"
tail -45 $OUT/bench-qwen3-8b-cuda-bf16.log
# 3. GPU-only tests (Triton kernels, CUDA graphs)
timeout 45 python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/ > $OUT/pytest-gpu.log 2>&1; tail -3 $OUT/pytest-gpu.log
# 4. the bench on the fixtures (real draft, measured acceptance)
timeout 25 python3 -P -m bloomery_cli.bench.command qwen3-dflash --device cuda -n 128 \
  --json $OUT/bench-qwen3-dflash-fixtures-cuda-bf16.json > /dev/null 2>&1; echo "bench fixtures exit $?"
