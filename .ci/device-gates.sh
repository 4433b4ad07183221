#!/usr/bin/env bash
# The GPU gates on the H200, run through the `device` tool (never by CI): installs the package beside the
# machine's own torch, then every gate in bf16 (records with their bands and state lines) and the GPU-only
# tests, all into $OUT. Each step writes under $OUT as it ends, so a cut run keeps what it measured.
# Usage (there): BLOOMERY_COMMIT=<sha> bash .ci/device-gates.sh   (carry .whl with the gguf wheel)
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
timeout ${GATES_TIMEOUT:-420} python3 -P -m bloomery_cli.cli gates --device cuda --dtype bf16 --no-oracle --results $R \
  > $R/gates-cuda-bf16.log 2>&1
echo "gates exit $?" | tee -a $R/gates-cuda-bf16.log
grep -E "^(PASSED|FAILED)|^ids identical|FAIL$|^│" $R/gates-cuda-bf16.log
tar -C /tmp -cf $OUT/gates.tar h200
timeout 60 python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/ > $OUT/pytest-gpu.log 2>&1; tail -3 $OUT/pytest-gpu.log
