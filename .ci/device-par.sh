#!/usr/bin/env bash
# Every gate on the H200, JOBS at a time (the fixtures are tiny: a gate is Python-bound on one core, and the
# machine has 16), run through the `device` tool (never by CI). Greedy bf16 (MODES has "greedy") and T = 1
# bf16 (MODES has "t1": the (s) line, accept_mean at T = 1). One record and one log per gate and mode,
# written as each gate ends, so a cut run keeps what it finished. Concurrency perturbs the timing fields
# (draft_share, the cost line's wall times): read acceptance, ids and verdicts from these records, speed
# from `bloomery bench`. Then the GPU-only tests (PYTEST=0 skips them).
# Usage (there): BLOOMERY_COMMIT=<sha> [JOBS=7] [MODES="greedy t1"] [GATES="a b"] bash .ci/device-par.sh
# (carry .whl with the gguf wheel)
set -uo pipefail
source .ci/device-setup.sh || exit 2
export OMP_NUM_THREADS=1
R=/tmp/h200-par && mkdir -p $R
{ device_info "jobs ${JOBS:-7}"
} > $R/device.txt
cat $R/device.txt
GATES=${GATES:-$(python3 -P -c "from bloomery_gates.gates import GATES; print(' '.join(GATES))")}
one() {  # gate mode
  local g=$1 m=$2 extra="" tag="cuda-bf16"
  [ "$m" = t1 ] && extra="--temperature 1" && tag="cuda-bf16-t1"
  timeout ${GATE_TIMEOUT:-400} python3 -P -m bloomery_cli.cli gate run $g --device cuda --dtype bf16 $extra \
    --json $R/$g-$tag.json > $R/$g-$tag.log 2>&1
  echo "$g $m exit $? $(grep -E '^(PASSED|FAILED)' $R/$g-$tag.log | head -1)"
}
export -f one; export R
for m in ${MODES:-greedy t1}; do for g in $GATES; do echo "$g $m"; done; done \
  | xargs -P ${JOBS:-7} -L 1 bash -c 'one "$0" "$1"' | tee $R/summary.txt
grep -h -E "FAIL$" $R/*.log | head -20
grep -h -E "^\(s\)" $R/*-t1.log | sed -E 's/.*(p=[0-9.e-]+ (PASS|FAIL))$/\1/' | sort | uniq -c
if [ "${PYTEST:-1}" = 1 ]; then   # the GPU-only tests (Triton kernels, CUDA graphs, CuPy, the draft device)
  timeout ${PYTEST_TIMEOUT:-180} python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/ > $R/pytest-gpu.log 2>&1
  tail -3 $R/pytest-gpu.log
fi
tar -C /tmp -cf $OUT/par.tar h200-par
