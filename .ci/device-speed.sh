#!/usr/bin/env bash
# Issue 11 on the H200 through the `device` tool (never CI), one call under the tool's 10 minutes:
#   BLOOMERY_COMMIT=<sha> [STEPS="tests gemv b8 q8 mtp b16"] bash .ci/device-speed.sh    (carry .whl)
# tests  the Triton / graphed-engine tests on CUDA (test_gemv, test_bench, test_qwen38_fast, the fast drafts;
#        TESTS="<paths>" for others)
# diag   .ci/diag_rollback.py with the projection kernel on and off: which part of the drafted run differs
# gemv   bloomery_cli.bench.gemv --wide at qwen3-8b and qwen38-27b: proj (split-K too) vs cuBLAS per weight shape;
#        the narrow weights' best tiles go to BLOOMERY_GEMV_CONFIGS for the benches below (GEMV_CONFIGS=<file>
#        skips the sweep and uses that file)
# wide   the plain step and verify at both shapes (-n 64, --profile) with the wide weights in proj too
# q8     bench qwen3-dflash --shape qwen3-8b --profile (HF in the same run)
# b8     bench qwen38-dflash2 --shape qwen38-27b --block 8 --hf --profile;  mtp: qwen38-mtp --mtp-width 3;
# b16    qwen38-dflash2 --block 16.
# ab     the plain step and verify at both shapes (-n 64, no HF) with BLOOMERY_GEMV=off (cuBLAS for every
#        projection) right after the same with the default: the projection kernel's effect, measured in one call.  Each step is cut to what is left of DEADLINE_S (default 570 s) and skipped
#        when under 40 s remain. Records + logs: one tar in $OUT.
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-570} ))
source .ci/device-setup.sh || exit 2
R=/tmp/speed && mkdir -p $R
device_info "speed" | tee $R/device.txt
show() { grep -E "$2" $R/$1.log | cut -c1-260; }
N=${N:-256}
for s in ${STEPS:-tests gemv q8 b8 mtp b16}; do
  case $s in
    tests) step tests ${TESTS_S:-150} python3 -P -m pytest -q -rf --tb=short -p no:cacheprovider ${TESTS:-tests/test_gemv.py tests/test_bench.py \
             tests/test_qwen38_fast.py tests/test_mtp_fast.py tests/test_dflash2_fast.py}; tail -3 $R/tests.log ;;
    diag) for g in auto off; do step diag-gemv-$g 60 env BLOOMERY_GEMV=$g python3 -P .ci/diag_rollback.py
            cat $R/diag-gemv-$g.log | cut -c1-200; done ;;
    gemv) if [ -n "${GEMV_CONFIGS:-}" ]; then export BLOOMERY_GEMV_CONFIGS=$PWD/$GEMV_CONFIGS; else
            step gemv 220 python3 -P -m bloomery_cli.bench.gemv --shape qwen3-8b --shape qwen38-27b --wide \
              --json $R/gemv-cuda-bf16.json --write-configs $R/gemv-configs-wide.json; show gemv "^(gemv|configs)"
            # the narrow weights' entries only: the wide ones stay on cuBLAS (the `wide` step runs them here)
            python3 -c "import json,sys; d=json.load(open(sys.argv[1])); json.dump({k: v for k, v in d.items() \
              if int(k.split('x')[0]) <= 8192}, open(sys.argv[2], 'w'))" $R/gemv-configs-wide.json $R/gemv-configs.json
            [ -s $R/gemv-configs.json ] && export BLOOMERY_GEMV_CONFIGS=$R/gemv-configs.json; fi ;;
    wide) [ -s $R/gemv-configs-wide.json ] || { echo "wide skipped: no gemv-configs-wide.json"; continue; }
          step wide-qwen3-8b 90 env BLOOMERY_GEMV_CONFIGS=$R/gemv-configs-wide.json python3 -P -m bloomery_cli.bench.command \
            qwen3-dflash --shape qwen3-8b --device cuda -n 64 --profile --json $R/wide-qwen3-8b-cuda-bf16.json
          show wide-qwen3-8b "^(plain|verify|profile (plain|verify))|Error"
          step wide-qwen38-27b 120 env BLOOMERY_GEMV_CONFIGS=$R/gemv-configs-wide.json python3 -P -m \
            bloomery_cli.bench.command qwen38-dflash2 --shape qwen38-27b --block 8 --device cuda -n 64 --profile \
            --json $R/wide-qwen38-27b-cuda-bf16.json
          show wide-qwen38-27b "^(plain|verify|profile (plain|verify))|Error" ;;
    q8) step bench-qwen3-8b 150 python3 -P -m bloomery_cli.bench.command qwen3-dflash --shape qwen3-8b --device cuda -n $N \
          --profile --json $R/bench-qwen3-8b-cuda-bf16.json
        show bench-qwen3-8b "^(engine|plain|verify|draft|criterion|transformers|profile (plain|verify|draft))|Error" ;;
    b8) step bench-qwen38-27b-dflash2-b8 200 python3 -P -m bloomery_cli.bench.command qwen38-dflash2 --shape qwen38-27b \
          --block 8 --hf --profile --device cuda -n $N --json $R/bench-qwen38-27b-dflash2-b8-cuda-bf16.json
        show bench-qwen38-27b-dflash2-b8 "^(engine|plain|verify|draft|criterion|transformers|ids|profile (plain|verify|draft))|Error" ;;
    mtp) step bench-qwen38-27b-mtp 150 python3 -P -m bloomery_cli.bench.command qwen38-mtp --shape qwen38-27b --mtp-width 3 \
          --device cuda -n $N --json $R/bench-qwen38-27b-mtp-cuda-bf16.json
        show bench-qwen38-27b-mtp "^(engine|plain|verify|draft|criterion|ids)|Error" ;;
    b16) step bench-qwen38-27b-dflash2-b16 150 python3 -P -m bloomery_cli.bench.command qwen38-dflash2 --shape qwen38-27b \
          --block 16 --device cuda -n $N --json $R/bench-qwen38-27b-dflash2-b16-cuda-bf16.json
        show bench-qwen38-27b-dflash2-b16 "^(engine|plain|verify|draft|criterion|ids)|Error" ;;
    ab) for g in on off; do
          v=$([ $g = off ] && echo off || echo auto)
          step ab-qwen3-8b-$g 90 env BLOOMERY_GEMV=$v python3 -P -m bloomery_cli.bench.command \
            qwen3-dflash --shape qwen3-8b --device cuda -n 64 --json $R/ab-qwen3-8b-gemv-$g-cuda-bf16.json
          show ab-qwen3-8b-$g "^(plain|verify)"
          step ab-qwen38-27b-$g 120 env BLOOMERY_GEMV=$v python3 -P -m \
            bloomery_cli.bench.command qwen38-dflash2 --shape qwen38-27b --block 8 --device cuda -n 64 \
            --json $R/ab-qwen38-27b-gemv-$g-cuda-bf16.json
          show ab-qwen38-27b-$g "^(plain|verify)"
        done ;;
  esac
done
tar -C /tmp -cf $OUT/speed.tar speed
