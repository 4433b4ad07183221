#!/usr/bin/env bash
# Issue 26's MXFP4 record on the H200, through the `device` tool (never CI): a deepseek4 checkpoint with native FP4
# routed experts (hidden 1024, 64 experts of 512, top-6, 4 layers, random bytes: tests/deepseek4_factory.py
# write_random_fp4), the engine built on CUDA (experts kept packed: kernels/ops/mxfp4), a prefill of 256 ids and a
# verify of 4; prints plan's prediction beside torch.cuda.max_memory_allocated after the load and after the run,
# their ratios (the issue's 2%), and the expert bytes resident vs bf16's; the JSON record under $OUT/mxfp4/ (copy
# it to results/h200/mxfp4/ and commit). Then the MXFP4 tests on CUDA's torch (host ones; they need no GPU).
# Usage there: BLOOMERY_COMMIT=<sha> bash .ci/device-mxfp4.sh   (carry .whl; under 3 minutes)
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-170} ))
source .ci/device-setup.sh || exit 2
R=${R_DIR:-$OUT/mxfp4} && mkdir -p $R
device_info "mxfp4" | tee $R/device.txt
step record 120 python3 -P .ci/device_mxfp4.py --out $R --device cuda ${MXFP4_ARGS:-}
cat $R/record.log
step tests 90 python3 -P -m pytest -q -p no:cacheprovider tests/test_ops_mxfp4.py tests/test_deepseek4_mxfp4.py \
  tests/test_deepseek4_plan.py
tail -3 $R/tests.log
