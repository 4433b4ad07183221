#!/usr/bin/env bash
# The gates at T = 1 on the H200, run through the `device` tool (never by CI): installs the package beside the
# machine's own torch, then every gate in bf16 with --temperature 1 (the (s) line, accept_mean at T = 1, records
# with their sampling conditions) into $OUT. Each gate writes its record as it ends, so a cut run keeps them.
# Usage (there): BLOOMERY_COMMIT=<sha> bash .ci/device-sampling.sh   (carry .whl with the gguf wheel)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/gguf-*.whl || exit 2
PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/pkg . || exit 2
export PYTHONPATH=/tmp/pkg:/tmp/site BLOOMERY_FIXTURES=$PWD/fixtures PYTHONUNBUFFERED=1
R=/tmp/h200-t1 && mkdir -p $R
{ date -u +%FT%TZ; echo "commit ${BLOOMERY_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -P -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} > $R/device.txt
cat $R/device.txt
timeout ${GATES_TIMEOUT:-540} python3 -P -m bloomery_cli.cli gates --device cuda --dtype bf16 --no-oracle \
  --temperature 1 --results $R > $R/gates-cuda-bf16-t1.log 2>&1
echo "gates exit $?" | tee -a $R/gates-cuda-bf16-t1.log
grep -E "^(PASSED|FAILED)|^\(s\)|^accept_mean|FAIL$|^│" $R/gates-cuda-bf16-t1.log
tar -C /tmp -cf $OUT/gates-t1.tar h200-t1
