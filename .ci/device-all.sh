#!/usr/bin/env bash
# Everything that needs the H200, in one call of the `device` tool (never CI): the bf16 gates, the Qwen3-8B-shape
# decode bench (roofline, verify cost, drafted speed, HF peer), the GPU-only tests, the bench on the fixtures.
# Each step has its own time limit and writes under $OUT as soon as it ends, so a cut run keeps what it measured.
# Usage there: BLOOMERY_COMMIT=<sha> bash .ci/device-all.sh        (carry .whl with the gguf wheel)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/gguf-*.whl || exit 2
PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/pkg . || exit 2
export PYTHONPATH=/tmp/pkg:/tmp/site BLOOMERY_FIXTURES=$PWD/fixtures PYTHONUNBUFFERED=1
R=/tmp/h200 && mkdir -p $R
{ date -u +%FT%TZ; echo "commit ${BLOOMERY_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -P -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} > $R/device.txt
cat $R/device.txt
# 1. every registered gate in bf16 (records + log), packed at once
timeout 280 python3 -P -m bloomery_cli.cli gates --device cuda --dtype bf16 --results $R > $R/gates-cuda-bf16.log 2>&1
echo "gates exit $?" | tee -a $R/gates-cuda-bf16.log
grep -E "^(PASSED|FAILED)|^ids identical|^accept_mean|FAIL$|^│" $R/gates-cuda-bf16.log
tar -C /tmp -cf $OUT/gates.tar h200
# 2. decode speed at the Qwen3-8B shape (the record is saved after every stage)
timeout 150 python3 -P -m bloomery_cli.bench qwen3-dflash --shape qwen3-8b --device cuda \
  --json $OUT/bench-qwen3-8b-cuda-bf16.json > $OUT/bench-qwen3-8b-cuda-bf16.log 2>&1; echo "bench exit $?"
tail -45 $OUT/bench-qwen3-8b-cuda-bf16.log
# 3. GPU-only tests (Triton kernels, CUDA graphs)
timeout 45 python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/ > $OUT/pytest-gpu.log 2>&1; tail -3 $OUT/pytest-gpu.log
# 4. the bench on the fixtures (real draft, measured acceptance)
timeout 25 python3 -P -m bloomery_cli.bench qwen3-dflash --device cuda -n 128 \
  --json $OUT/bench-qwen3-dflash-fixtures-cuda-bf16.json > /dev/null 2>&1; echo "bench fixtures exit $?"
