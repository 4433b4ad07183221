#!/usr/bin/env bash
# Issue 26's MXFP4 record on the H200, through the `device` tool (never CI): a deepseek4 checkpoint with native FP4
# routed experts (hidden 1024, 64 experts of 512, top-6, 4 layers, random bytes: tests/deepseek4_factory.py
# write_random_fp4), the engine built on CUDA (experts kept packed: kernels/ops/mxfp4), a prefill of 256 ids and a
# verify of 4; prints plan's prediction beside torch.cuda.max_memory_allocated after the load and after the run,
# their ratios (the issue's 2%), and the expert bytes resident vs bf16's; the JSON record under $OUT/mxfp4/ (copy
# it to results/h200/mxfp4/ and commit). Then the MXFP4 tests on CUDA's torch (host ones; they need no GPU).
# Usage there: BLOOMERY_COMMIT=<sha> bash .ci/device-mxfp4.sh   (carry .whl when there is one; under 3 minutes)
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-170} ))
if ls .whl/gguf-*.whl >/dev/null 2>&1; then source .ci/device-setup.sh || exit 2
else   # no gguf wheel carried: this record needs none; the package alone, as device-setup.sh installs it
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/pkg . || exit 2
  export PYTHONPATH=/tmp/pkg PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  left() { echo $(( DEADLINE - $(date +%s) )); }
  step() { local name=$1 lim=$2; shift 2; local l; l=$(left)
    [ $l -lt ${STEP_MIN_S:-40} ] && { echo "$name skipped: ${l}s left"; return; }
    [ $(( l - 10 )) -lt $lim ] && lim=$(( l - 10 )); local t=$(date +%s)
    timeout $lim "$@" > $R/$name.log 2>&1; echo "$name exit $? in $(( $(date +%s) - t ))s"; }
  device_info() { date -u +%FT%TZ; echo "commit ${BLOOMERY_COMMIT:-unknown} $*"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -P -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; }
fi
R=${R_DIR:-$OUT/mxfp4} && mkdir -p $R
device_info "mxfp4" | tee $R/device.txt
step record 120 python3 -P .ci/device_mxfp4.py --out $R --device cuda ${MXFP4_ARGS:-}
cat $R/record.log
step tests 90 python3 -P -m pytest -q -p no:cacheprovider tests/test_ops_mxfp4.py tests/test_deepseek4_mxfp4.py \
  tests/test_deepseek4_plan.py
tail -3 $R/tests.log
