#!/usr/bin/env bash
# Issue 15 on the device (through the `device` tool, never by CI): the draft on a device of its own and the
# target split over cards. On one GPU: every gate with the target on cuda (bf16) and the
# draft on the CPU (--draft-device cpu: the taps cross to the host once per window; the `crossing` line says
# bytes and time), JOBS at a time. Only where `nvidia-smi -L` lists 2 or more GPUs: the same gates with
# --draft-device cuda:1, and the qwen3 gates with the target split over cuda:0, cuda:1 (--tp 2, NCCL), plus
# the NCCL gate test. One record and one log per run, written as each ends; everything into $OUT.
# Concurrency perturbs the timing fields (draft_share, transfer_share): read ids, verdicts and bytes here.
# Usage (there): BLOOMERY_COMMIT=<sha> [JOBS=4] [DRAFT_THREADS=2] [GATES="a b"] bash .ci/device-tp.sh
# (carry .whl with the gguf wheel)
set -uo pipefail
source .ci/device-setup.sh || exit 2
export OMP_NUM_THREADS=1
R=/tmp/h200-tp && mkdir -p $R
NGPU=$(nvidia-smi -L | wc -l)
{ device_info "jobs ${JOBS:-4} gpus $NGPU"
} > $R/device.txt
cat $R/device.txt
QWEN3="qwen3-dflash qwen3-dflash2 qwen3-dspark qwen3-eagle3 qwen3yarn-dflash qwen3-dflash-swa qwen3-dflash-swa-spec"
GATES=${GATES:-$(python3 -P -c "from bloomery_gates.gates import GATES; print(' '.join(GATES))")}
one() {  # gate tag extra-flags...
  local g=$1 tag=$2; shift 2
  timeout ${GATE_TIMEOUT:-400} python3 -P -m bloomery_cli.cli gate run $g --device cuda --dtype bf16 "$@" \
    --json $R/$g-$tag.json > $R/$g-$tag.log 2>&1
  echo "$g $tag exit $? $(grep -E '^(PASSED|FAILED)' $R/$g-$tag.log | head -1) $(grep -E '^crossing' $R/$g-$tag.log)"
}
export -f one; export R
{ for g in $GATES; do echo "$g cuda-bf16-draftcpu --draft-device cpu --threads ${DRAFT_THREADS:-2}"; done
  if [ "$NGPU" -ge 2 ]; then
    for g in $GATES; do echo "$g cuda-bf16-draftcuda1 --draft-device cuda:1"; done
    for g in $QWEN3; do echo "$g cuda-bf16-tp2 --tp 2"; done
  else
    echo "blocked: $NGPU GPU(s): the --draft-device cuda:1 and --tp 2 runs need 2" >&2
  fi
} | xargs -P ${JOBS:-4} -L 1 bash -c 'one "$@"' _ | tee $R/summary.txt
grep -h -E "FAIL$" $R/*.log | head -20
if [ "$NGPU" -lt 2 ]; then   # the refusal on one card: exit 2 with the named error, before any work
  python3 -P -m bloomery_cli.cli gate run qwen3-dflash --device cuda --tp 2 -n 8 > $R/tp2-one-gpu.log 2>&1
  echo "tp2 on $NGPU GPU exit $? (expected 2): $(tail -1 $R/tp2-one-gpu.log)" | tee -a $R/summary.txt
fi
# the GPU tests of issue 15: target cuda / draft cpu (one card), TP over NCCL (skipped, with its reason, on one card)
timeout 300 python3 -P -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_draft_device.py tests/test_tp.py \
  > $R/pytest-gpu-tp.log 2>&1; tail -4 $R/pytest-gpu-tp.log
tar -C /tmp -cf $OUT/tp.tar h200-tp
