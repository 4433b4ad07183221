#!/usr/bin/env bash
# Issue 27 on the H200 through the `device` tool (never CI), one call: the projection kernel's weight tiles copied
# by the tensor memory accelerator (gemv.proj tiles' sixth field), in isolation and in the 8B step under PDL; the
# gates and llama.cpp in the same run only when a setting beats the default. With SETTINGS given, any diag of the
# step's settings (tiles, split-K, L2 budgets: what .ci/device-splitk.sh ran at 4bb4998).
#   BLOOMERY_COMMIT=<sha> [STEPS="build gemv diag gates bench8"] bash .ci/device-tma.sh     (carry .whl .llama-src)
# build   bloomery engine build --cuda --arch 90 --bench in the background (14 jobs)
# gemv    python -m bloomery_cli.bench.gemv over TMA tiles at the 8B and 27B weights (narrow and wide), R = 1 / 16
# diag    .ci/diag_pdl.py at qwen3-8b: the default, gemv's best tiles (diag_pdl.py --flags) with / without gate/up
# gates   bloomery gates --engine fast --device cuda --dtype bf16 under the fastest setting (records: $OUT)
# bench8  bloomery bench qwen3-dflash --shape qwen3-8b --llama-cpp under the fastest setting
# b27     bench qwen38-mtp at the 27B width, 16 layers, MTP x3, under each of SETTINGS27 (diag_pdl settings)
# tests   the CUDA tests of the projection, PDL and the graphed engines
# SETTINGS (diag; may name $T, gemv's best TMA tiles), CANDS and GEMV_ARGS (gemv), SETTINGS27, FORCE=1 (gates / bench8 even when the default is fastest): the environment
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-560} ))
source .ci/device-setup.sh || exit 2
R=/tmp/tma && mkdir -p $R && device_info "tma" | tee $R/device.txt
LL=/tmp/llama-cuda
SRC=$(ls $PWD/.llama-src/*.tar.gz 2>/dev/null | head -1)
B=on+early+l2=4
BEST=$B
knobs() { python3 -P .ci/diag_pdl.py --env $R "$1"; }
for s in ${STEPS:-build gemv diag gates bench8}; do
  case $s in
    build) ( timeout 420 python3 -P -m bloomery_cli.cli engine build --out $LL --cuda --arch 90 --jobs 14 --bench \
               --source $SRC > $R/build.log 2>&1; echo "build exit $?" >> $R/build.log ) & ;;
    gemv) C=""; for c in ${CANDS:-64,256,4,4,1,0 64,256,4,4,1,1 64,128,4,4,1,1 64,128,4,6,1,1 32,256,4,4,1,1 \
                       128,128,4,4,1,1 128,256,4,3,1,1 64,256,4,4,2,1 128,64,4,8,1,1}; do C="$C --candidate $c"; done
          step gemv ${GEMV_S:-150} python3 -P -m bloomery_cli.bench.gemv ${GEMV_ARGS:---shape qwen3-8b --shape qwen38-27b \
            --wide} $C --json $R/gemv-cuda-bf16.json --write-configs $R/gemv-best.json
          grep -E "^gemv|^bandwidth|configs" $R/gemv.log | cut -c1-200 ;;
    diag) T=$(python3 -P .ci/diag_pdl.py --flags $R/gemv-best.json 2>/dev/null)    # gemv's best tiles as flags
          N=$(echo "$T" | tr + '\n' | grep -v '^t24576x4096' | paste -sd+)                 # the same but gate/up
          echo "gemv's tiles: ${T:-none}"
          eval "SET=\"${SETTINGS:-$B ${T:+$B+$T} ${N:+$B+$N} $B}\""
          step diag ${DIAG_S:-170} python3 -P .ci/diag_pdl.py -n 256 $SET
          cut -c1-250 $R/diag.log
          BEST=$(grep -E "^pdl=.*chain_ids_identical=True" $R/diag.log \
                 | sed -E 's/^pdl=([^ ]+) .*chain16 tok_s=([0-9.]+).*/\2 \1/' | sort -rn | head -1 | cut -d' ' -f2)
          BEST=${BEST:-$B}; echo "fastest setting: $BEST"; cat $(knobs $BEST) ;;
    gates) [ "$BEST" = "$B" ] && [ -z "${FORCE:-}" ] && { echo "gates skipped: the default is fastest"; continue; }
           ( source $(knobs $BEST); env | grep ^BLOOMERY_ | sort
             step gates ${GATES_S:-100} python3 -P -m bloomery_cli.cli gates --engine fast --device cuda --dtype bf16 \
               --results $R/fast )
           grep -E "^(PASSED|FAILED)|│ qwen3" $R/gates.log | cut -c1-120 | head -12 ;;
    bench8) [ "$BEST" = "$B" ] && [ -z "${FORCE:-}" ] && { echo "bench8 skipped: the default is fastest"; continue; }
            while ! grep -q "build exit" $R/build.log 2>/dev/null && [ $(left) -gt 60 ]; do sleep 5; done
            tail -2 $R/build.log | cut -c1-200
            ( source $(knobs $BEST); STEP_MIN_S=50 step bench8 ${BENCH8_S:-100} python3 -P -m bloomery_cli.cli bench \
                qwen3-dflash --shape qwen3-8b --device cuda --llama-cpp $LL \
                --json $R/bench-qwen3-8b-llamacpp-cuda-bf16.json )
            grep -E "^(plain|chain|llama)" $R/bench8.log | cut -c1-200 ;;
    b27) i=0; for st in ${SETTINGS27:-$B}; do i=$((i + 1)); echo "b27-$i: $st"
           ( source $(knobs $st); R=$R STEP_MIN_S=60 step b27-$i ${B27_S:-100} python3 -P -m bloomery_cli.bench.command \
               qwen38-mtp --shape qwen38-27b --layers 16 --mtp-width 3 --device cuda -n 128 \
               --json $R/bench-qwen38-27b-l16-mtp-$i-cuda-bf16.json )
           grep -E "^(plain|chain k=16|draft |device_accept a=0.8)|Error" $R/b27-$i.log | cut -c1-230
         done ;;
    tests) step tests ${TESTS_S:-120} python3 -P -m pytest -q -p no:cacheprovider tests/test_gemv.py tests/test_pdl.py \
             tests/test_fast_engine.py tests/test_qwen38_fast.py tests/test_mtp_fast.py tests/test_chain.py
           tail -3 $R/tests.log | cut -c1-200 ;;
  esac
done
tar czf $OUT/tma.tgz -C $R . && echo "records in tma.tgz"
