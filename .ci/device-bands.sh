#!/usr/bin/env bash
# The emulated (r) bands at the Qwen3-8B shape on the H200 (random weights, bf16): `bloomery bands`, into $OUT.
# Usage (there): BLOOMERY_COMMIT=<sha> bash .ci/device-bands.sh   (carry .whl with the gguf wheel)
set -uo pipefail
source .ci/device-setup.sh || exit 2
timeout ${BANDS_TIMEOUT:-540} python3 -P -m bloomery_cli.cli bands --shape qwen3-8b --device cuda --dtype bf16 \
  --prompt-len 64 --json $OUT/bands-qwen3-8b-cuda-bf16.json 2>&1 | tee $OUT/bands-qwen3-8b-cuda-bf16.log | tail -20
