#!/usr/bin/env bash
# Issue 27 on the H200 through the `device` tool (never CI), one call: the 8B projections' tiles in the step under
# PDL (split-K, narrower slabs: more programs than the 64 / 96 of o_proj / q,k,v on 132 SMs) and the L2 budget, then
# the gates and llama.cpp in the same run under the fastest setting.
#   BLOOMERY_COMMIT=<sha> [STEPS="build diag gates bench8"] bash .ci/device-splitk.sh       (carry .whl .llama-src)
# build   bloomery engine build --cuda --arch 90 --bench in the background (14 jobs)
# diag    .ci/diag_pdl.py at qwen3-8b over SETTINGS (tNxK=BNxBKxWARPSxSTAGESxSPLITS flags: BLOOMERY_GEMV_CONFIGS)
# gates   bloomery gates --engine fast --device cuda --dtype bf16 under the fastest setting (records: $OUT)
# bench8  bloomery bench qwen3-dflash --shape qwen3-8b --llama-cpp under the fastest setting (cut at the call's end)
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-430} ))
source .ci/device-setup.sh || exit 2
R=/tmp/splitk && mkdir -p $R && device_info "splitk" | tee $R/device.txt
LL=/tmp/llama-cuda
SRC=$(ls $PWD/.llama-src/*.tar.gz 2>/dev/null | head -1)
BEST="on+early+l2=4"
knobs() {  # a diag setting -> the environment the engines read ($R/env.sh; diag_pdl's own rule)
  python3 -P .ci/diag_pdl.py --env $R "$1"
}
B=on+early+l2=4
for s in ${STEPS:-build diag gates bench8}; do
  case $s in
    build) ( timeout 400 python3 -P -m bloomery_cli.cli engine build --out $LL --cuda --arch 90 --jobs 14 --bench \
               --source $SRC > $R/build.log 2>&1; echo "build exit $?" >> $R/build.log ) & ;;
    diag) step diag ${DIAG_S:-130} python3 -P .ci/diag_pdl.py -n 256 ${SETTINGS:-$B $B+t4096x4096=64x256x4x4x2 \
            $B+t4096x4096=32x256x4x4x1 $B+t6144x4096=64x256x4x4x2 $B+t4096x12288=64x256x4x4x1 \
            $B+t4096x12288=64x256x4x4x3 on+early+l2=8 on+early+l2=2 $B}
          cut -c1-250 $R/diag.log
          BEST=$(grep -E "^pdl=.*chain_ids_identical=True" $R/diag.log \
                 | sed -E 's/^pdl=([^ ]+) .*chain16 tok_s=([0-9.]+).*/\2 \1/' | sort -rn | head -1 | cut -d' ' -f2)
          BEST=${BEST:-$B}; echo "fastest setting: $BEST"; cat $(knobs $BEST) ;;
    gates) ( source $(knobs $BEST); env | grep ^BLOOMERY_ | sort
             step gates ${GATES_S:-100} python3 -P -m bloomery_cli.cli gates --engine fast --device cuda --dtype bf16 \
               --results $R/fast )
           grep -E "^(PASSED|FAILED)|│ qwen3" $R/gates.log | cut -c1-120 | head -12 ;;
    bench8) while ! grep -q "build exit" $R/build.log 2>/dev/null && [ $(left) -gt 60 ]; do sleep 5; done
            tail -2 $R/build.log | cut -c1-200
            ( source $(knobs $BEST); STEP_MIN_S=50 step bench8 ${BENCH8_S:-100} python3 -P -m bloomery_cli.cli bench \
                qwen3-dflash --shape qwen3-8b --device cuda --llama-cpp $LL \
                --json $R/bench-qwen3-8b-llamacpp-cuda-bf16.json )
            grep -E "^(plain|chain|llama)" $R/bench8.log | cut -c1-200 ;;
  esac
done
tar czf $OUT/splitk.tgz -C $R . && echo "records in splitk.tgz"
