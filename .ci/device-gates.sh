#!/usr/bin/env bash
# The GPU gates on the H200, run through the `device` tool (never by CI): installs the package beside the
# machine's own torch, then the bf16 gates, the GPU-only tests and the DFlash2 kernel bench, all into $OUT.
# Usage (there): BLOOMERY_COMMIT=<sha> bash .ci/device-gates.sh   (carry .whl with the gguf wheel)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/gguf-*.whl || exit 2
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/pkg . || exit 2
export PYTHONPATH=/tmp/pkg:/tmp/site BLOOMERY_FIXTURES=$PWD/fixtures PYTHONUNBUFFERED=1
mkdir -p "$OUT/results"
log="$OUT/results/gates-cuda-bf16.log"
{ date -u +%FT%TZ; echo "commit ${BLOOMERY_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} | tee "$log"
python3 -P -m bloomery_cli.cli gates --device cuda --dtype bf16 --results "$OUT/results" 2>&1 | tee -a "$log"
gates=${PIPESTATUS[0]}
python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/ 2>&1 | tail -25 | tee "$OUT/results/pytest-gpu.log"
python3 -P -m bloomery_cli.bench_dflash2 --device cuda --json "$OUT/results/bench-dflash2-kernels.json" 2>&1 \
  | tee "$OUT/results/bench-dflash2-kernels.log"
exit "$gates"
