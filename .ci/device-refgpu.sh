#!/usr/bin/env bash
# The float64 reference on the GPU through CuPy (issue 16), on the H200 through the `device` tool (never by CI).
# Three parts, each one call (each under the tool's 10 minutes), each leaving one tar (records + logs) in $OUT:
#   PART=fixtures   the six original gates in bf16, each twice (all 12 runs at once): the host reference, then --reference-device cuda
#                   --reference-compare (its (r) line: worst rel between the two references <= 1e-12); the (r)
#                   verdicts of the two runs side by side (verdicts.txt); the CuPy test (pytest -m gpu tests/test_xp.py)
#   PART=qwen3-8b   the real-layout Qwen3-8B + DFlash-b16 gate (bloomery_cli.fixturegen.real_layout), host reference
#                   then GPU reference with --reference-compare (COMPARE=0: without): wall per phase, reference_s, peaks
#   PART=qwen38-27b the Qwen3.8-27B shape at real width, LAYERS (16) of its 64 layers, gate qwen38-dflash2, likewise
# Usage (there): BLOOMERY_COMMIT=<sha> PART=fixtures bash .ci/device-refgpu.sh   (carry .whl with the gguf wheel)
set -uo pipefail
source .ci/device-setup.sh || exit 2
PART=${PART:-fixtures}; R=/tmp/refgpu-$PART && mkdir -p $R
{ device_info "part $PART"
  python3 -P -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__, 'cuda runtime', cupy.cuda.runtime.runtimeGetVersion())"
  free -g | head -2
} > $R/device.txt
cat $R/device.txt

verdicts() {   # host.json cuda.json -> one line per (r) check: verdict on the host reference, on the GPU reference
  python3 -P - "$1" "$2" <<'EOF'
import json, sys
def checks(p):
    try:
        return [(c["line"].split(" vs ")[0], c["ok"]) for c in json.load(open(p))["checks"] if c["line"].startswith("(r)")]
    except (OSError, ValueError, KeyError) as e:
        return [(f"no record {p}: {e}", None)]
host, dev = checks(sys.argv[1]), dict(checks(sys.argv[2]))
same = sum(dev.get(k) == ok for k, ok in host)
for k, ok in host:
    print(f"{'same' if dev.get(k) == ok else 'DIFFERENT'} host={ok} cuda={dev.get(k)} {k}")
extra = [k for k in dev if k not in dict(host)]
print(f"summary: {same} of {len(host)} host (r) verdicts equal on the GPU reference; lines only there: {extra}")
EOF
}

if [ "$PART" = fixtures ]; then
  # the 12 runs at once (tiny fixtures: each is Python-bound on one core of 16; wall times are not compared here)
  run() {  # gate host|refgpu
    local flags=""; [ $2 = refgpu ] && flags="--reference-device cuda --reference-compare"
    timeout ${GATE_TIMEOUT:-300} python3 -P -m bloomery_cli.cli gate run $1 --device cuda --dtype bf16 $flags \
      --json $R/$1-$2.json > $R/$1-$2.log 2>&1; echo "$1 $2 exit $?" | tee -a $R/$1-$2.log
  }
  GATES="qwen3-dflash qwen3-dspark qwen3-dflash2 qwen38-mtp qwen38-dflash qwen38-dflash2"
  for g in $GATES; do run $g host & run $g refgpu & done; wait
  for g in $GATES; do
    grep -E "^\(r\) reference on|^cost|^(PASSED|FAILED)" $R/$g-refgpu.log
    { echo "== $g"; verdicts $R/$g-host.json $R/$g-refgpu.json; } >> $R/verdicts.txt
  done
  grep -E "^summary|^==" $R/verdicts.txt
  timeout 120 python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/test_xp.py > $R/pytest-gpu-xp.log 2>&1
  tail -3 $R/pytest-gpu-xp.log
else
  N=${N:-32}; W=/tmp/ck/$PART
  [ "$PART" = qwen38-27b ] && LAYERS=${LAYERS:-16}
  t0=$(date +%s)
  python3 -P -m bloomery_cli.fixturegen.real_layout $PART $W ${LAYERS:+--layers $LAYERS} --device cuda \
    > $R/write.log 2>&1
  echo "write_s $(( $(date +%s) - t0 ))" | tee -a $R/write.log
  if [ "$PART" = qwen3-8b ]; then G=qwen3-dflash D=$W/dflash-b16; else G=qwen38-dflash2 D=$W/dflash2-b8; fi
  for ref in host refgpu; do
    flags=""; [ $ref = refgpu ] && flags="--reference-device cuda"
    [ $ref = refgpu ] && [ "${COMPARE:-1}" = 1 ] && flags="$flags --reference-compare"
    timeout ${GATE_TIMEOUT:-300} python3 -P -m bloomery_cli.cli gate run $G --target $W/target --draft $D \
      --prompts $W/prompts.jsonl -n $N --device cuda --dtype bf16 $flags --json $R/$G-$PART-$ref.json \
      > $R/$G-$PART-$ref.log 2>&1
    echo "$G $ref exit $?" | tee -a $R/$G-$PART-$ref.log
    grep -E "^load|^\(r\) reference on|^cost|^(PASSED|FAILED)|FAIL$" $R/$G-$PART-$ref.log
  done
  verdicts $R/$G-$PART-host.json $R/$G-$PART-refgpu.json > $R/verdicts.txt; tail -1 $R/verdicts.txt
  rm -rf /tmp/ck
fi
tar -C /tmp -cf $OUT/refgpu-$PART.tar refgpu-$PART
