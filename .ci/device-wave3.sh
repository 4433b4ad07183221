#!/usr/bin/env bash
# The third wave's gates on the H200 in bf16, through the `device` tool (never CI): qwen4exp-mtp, glm5next-mtp and
# ds4-mtp on their bundled fixtures (records under $OUT/wave3, copied to results/h200/), then issue 26's MXFP4 record
# (.ci/device_mxfp4.py: plan vs torch.cuda.max_memory_allocated, expert bytes vs bf16).
# Usage there: BLOOMERY_COMMIT=<sha> [GATES="..."] [STEPS="gates mxfp4"] bash .ci/device-wave3.sh   (carry .whl)
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-480} ))
source .ci/device-setup.sh || exit 2
R=${R_DIR:-$OUT/wave3} && mkdir -p $R
device_info "wave3" | tee $R/device.txt
for s in ${STEPS:-gates mxfp4}; do
  case $s in
    gates) for g in ${GATES:-glm5next-mtp ds4-mtp qwen4exp-mtp}; do
             step $g ${GATE_S:-150} python3 -P -m bloomery_cli.cli gate run $g --device cuda --dtype bf16 \
               --json $R/$g-cuda-bf16.json
             grep -E "^(ids identical|accept_mean|PASSED|FAILED)|FAIL$" $R/$g.log | cut -c1-160
           done ;;
    mxfp4) step mxfp4 120 python3 -P .ci/device_mxfp4.py --out $R --device cuda ${MXFP4_ARGS:-}
           tail -8 $R/mxfp4.log | cut -c1-200 ;;
  esac
done
