#!/usr/bin/env bash
# Where a decode step's time goes on the H200 (issue 11: "profile first"), through the `device` tool (never CI):
#   BLOOMERY_COMMIT=<sha> bash .ci/device-profile.sh        (carry .whl with the gguf wheel)
# `bloomery bench --profile` at qwen3-8b (DFlash B=16) and at the qwen38-27b width (DFlash2 B=8, LAYERS of its 64
# layers, default 16), -n 32 (the profile, not the sweep, is the point); one tar of records + logs in $OUT.
set -uo pipefail
source .ci/device-setup.sh || exit 2
R=/tmp/profile && mkdir -p $R
{ device_info "profile"; python3 -P -c "import torch, numpy; print('torch threads', torch.get_num_threads(), 'numpy', numpy.__version__)"; nproc; } > $R/device.txt
cat $R/device.txt
timeout ${T:-150} python3 -P -m bloomery_cli.bench.command qwen3-dflash --shape qwen3-8b --device cuda -n 32 --profile \
  --json $R/profile-qwen3-8b-cuda-bf16.json > $R/profile-qwen3-8b-cuda-bf16.log 2>&1
echo "qwen3-8b exit $?"; grep -E "^(engine|plain|verify|draft|criterion|profile)" $R/profile-qwen3-8b-cuda-bf16.log | cut -c1-200
timeout ${T:-150} python3 -P -m bloomery_cli.bench.command qwen38-dflash2 --shape qwen38-27b --layers ${LAYERS:-16} --block 8 \
  --device cuda -n 32 --profile --json $R/profile-qwen38-27b-l${LAYERS:-16}-cuda-bf16.json \
  > $R/profile-qwen38-27b-l${LAYERS:-16}-cuda-bf16.log 2>&1
echo "qwen38-27b exit $?"; grep -E "^(engine|plain|verify|draft|criterion|profile)" $R/profile-qwen38-27b-l*-cuda-bf16.log | cut -c1-200
tar -C /tmp -cf $OUT/profile.tar profile
