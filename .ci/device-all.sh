#!/usr/bin/env bash
# Everything that needs the H200, in one call of the `device` tool (never CI): the bf16 gates, the GPU-only
# tests, the Qwen3-8B-shape decode bench (roofline, verify cost, drafted speed, HF peer), the bench on the
# fixtures, and the DFlash2 kernel bench. Output: one tar under $OUT (the tool returns at most 8 files).
# Usage there: BLOOMERY_COMMIT=<sha> bash .ci/device-all.sh        (carry .whl with the gguf wheel)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/gguf-*.whl || exit 2
PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/pkg . || exit 2
export PYTHONPATH=/tmp/pkg:/tmp/site BLOOMERY_FIXTURES=$PWD/fixtures PYTHONUNBUFFERED=1
R=/tmp/h200 && mkdir -p $R
py() { python3 -P "$@"; }
{ date -u +%FT%TZ; echo "commit ${BLOOMERY_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  py -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} > $R/device.txt
cat $R/device.txt
timeout 200 python3 -P -m bloomery_cli.cli gates --device cuda --dtype bf16 --results $R > $R/gates-cuda-bf16.log 2>&1
echo "gates exit $?" | tee -a $R/gates-cuda-bf16.log
grep -E "^(PASSED|FAILED)|^ids identical|^accept_mean|FAIL$" $R/gates-cuda-bf16.log
timeout 60 python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/ > $R/pytest-gpu.log 2>&1; tail -2 $R/pytest-gpu.log
timeout 170 python3 -P -m bloomery_cli.bench qwen3-dflash --shape qwen3-8b --device cuda \
  --json $R/bench-qwen3-8b-cuda-bf16.json > $R/bench-qwen3-8b-cuda-bf16.log 2>&1; echo "bench exit $?"
tail -40 $R/bench-qwen3-8b-cuda-bf16.log
timeout 30 python3 -P -m bloomery_cli.bench qwen3-dflash --device cuda -n 128 \
  --json $R/bench-qwen3-dflash-fixtures-cuda-bf16.json > $R/bench-fixtures.log 2>&1; echo "bench fixtures exit $?"
timeout 40 python3 -P -m bloomery_cli.bench_dflash2 --device cuda --json $R/bench-dflash2-kernels.json \
  > $R/bench-dflash2-kernels.log 2>&1; echo "dflash2 kernels exit $?"
tar -C /tmp -cf $OUT/h200.tar h200
