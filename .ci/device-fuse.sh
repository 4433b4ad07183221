#!/usr/bin/env bash
# Issue 27 on the H200 through the `device` tool (never CI), one call: the 8B step's fusions (the attention's
# combine in its split kernel, the FFN's norm deferred into the output projection's epilogue and the SiLU kernel).
#   BLOOMERY_COMMIT=<sha> [STEPS="build abp gates bench8 tests b27"] bash .ci/device-fuse.sh    (carry .whl .llama-src)
#   (.llama-src: bash .ci/llama-src.sh)
# build   bloomery engine build --cuda --arch 90 --bench in the background (14 jobs)
# ab      .ci/diag_ceiling.py at qwen3-8b: the fused default against each fusion undone and both (ids compared)
# abp     the same, the tree's variants AB0 (default: base old-norm base), then with each of PATCHES (patch files,
#         -p1, in the order given) reverted on top of the ones before, the package reinstalled each time; restored
#         after, and AB_END's variants run on the restored tree. The patches of the 62b2948 call:
#         results/h200/speed/62b2948-ab/
# tests   (TESTS: the files, default below) the CUDA tests of the fused ops, the projection, PDL and the graphed engines
# gates   bloomery gates --engine fast --device cuda --dtype bf16 (records: $R/fast)
# gatesd  the same with the fixtures' qwen3 gate/up [768, 128] sent to cuBLAS (BLOOMERY_GEMV_CONFIGS), so that the
#         qwen3 fast gates run the deferred FFN norm (TritonOps.ffn_input) the 8B takes; the fixtures' narrow
#         gate/up otherwise runs in the projection kernel with its norm folded (records: $R/fast-deferred)
# gemv    python -m bloomery_cli.bench.gemv at the 8B and 27B narrow weights, the table's tiles only, 1 and 16 rows:
#         the fixed-cost fit (docs/SPEED.md) on a fresh run (beside the build)
# bench8  bloomery bench qwen3-dflash --shape qwen3-8b with llama.cpp's CUDA build in the same run
# b27     bench qwen38-mtp at the 27B width, 16 layers, MTP x3 (-n 128)
# d27     bench qwen38-dflash2 at the 27B width, 16 layers, B8 (-n each of D27_N, default 64), with the window's kernel profile
# commit  .ci/diag_commit.py at the 27B width, 16 layers: the one-launch commit against the per-layer one, twice each
# Each step is cut to what is left of DEADLINE_S (default 560 s). Records + logs: one tar in $OUT.
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-560} ))
source .ci/device-setup.sh || exit 2
R=/tmp/fuse && mkdir -p $R && device_info "fuse" | tee $R/device.txt
LL=/tmp/llama-cuda
reinstall() { PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade \
                --target /tmp/pkg . > /dev/null 2>&1; }
SRC=$(ls $PWD/.llama-src/*.tar.gz 2>/dev/null | head -1)
for s in ${STEPS:-build abp gates bench8 tests}; do
  case $s in
    build) ( timeout 420 python3 -P -m bloomery_cli.cli engine build --out $LL --cuda --arch 90 --jobs 14 --bench \
               --source $SRC > $R/build.log 2>&1; echo "build exit $?" >> $R/build.log ) & ;;
    ab) step ab ${AB_S:-110} python3 -P .ci/diag_ceiling.py -n 256 ${AB:-base old-combine old-norm old-combine+old-norm base}
        grep "^skip=" $R/ab.log | cut -c1-200 ;;
    abp) step ab-0 ${AB_S:-80} python3 -P .ci/diag_ceiling.py -n 256 ${AB0:-base old-norm base}; grep "^skip=" $R/ab-0.log
         PS=(${PATCHES:-})
         for P in "${PS[@]}"; do n=$(basename $P .patch)
           patch -s -p1 -R < $P && reinstall && step ab-$n ${AB1_S:-50} python3 -P .ci/diag_ceiling.py -n 256 base
           echo "reverted up to $n:"; grep "^skip=" $R/ab-$n.log
         done
         for ((i=${#PS[@]}-1; i>=0; i--)); do patch -s -p1 < ${PS[$i]}; done; reinstall
         if [ -n "${AB_END:-}" ]; then step ab-end ${AB1_S:-50} python3 -P .ci/diag_ceiling.py -n 256 $AB_END
           echo "restored:"; grep "^skip=" $R/ab-end.log; fi ;;
    tests) step tests ${TESTS_S:-150} python3 -P -m pytest -q -p no:cacheprovider ${TESTS:-tests/test_ffn_input.py \
             tests/test_gemv.py tests/test_bench.py tests/test_fast_engine.py \
             tests/test_chain.py tests/test_mtp_fast.py tests/test_qwen38_fast.py tests/test_dflash2_fast.py \
             tests/test_accept.py tests/test_pdl.py tests/test_deltanet_fast.py}
           tail -4 $R/tests.log | cut -c1-200 ;;
    gates) step gates ${GATES_S:-110} python3 -P -m bloomery_cli.cli gates --engine fast --device cuda --dtype bf16 \
             --results $R/fast
           grep -E "^(PASSED|FAILED)|│ qwen3" $R/gates.log | cut -c1-120 | head -12 ;;
    gatesd) echo '{"768x128": null}' > $R/gemv-deferred.json
            ( export BLOOMERY_GEMV_CONFIGS=$R/gemv-deferred.json; step gatesd ${GATES_S:-110} python3 -P -m \
                bloomery_cli.cli gates --engine fast --device cuda --dtype bf16 --results $R/fast-deferred )
            grep -E "^(PASSED|FAILED)" $R/gatesd.log | cut -c1-120 ;;
    gemv) step gemv ${GEMV_S:-150} python3 -P -m bloomery_cli.bench.gemv --shape qwen3-8b --shape qwen38-27b \
            --candidate 64,256,4,4,1,1 --json $R/gemv-cuda-bf16.json
          grep -E "^(gemv|fit)" $R/gemv.log | cut -c1-200 ;;
    bench8) while ! grep -q "build exit" $R/build.log 2>/dev/null && [ $(left) -gt 60 ]; do sleep 5; done
            tail -2 $R/build.log | cut -c1-200
            STEP_MIN_S=50 step bench8 ${BENCH8_S:-110} python3 -P -m bloomery_cli.cli bench qwen3-dflash \
              --shape qwen3-8b --device cuda --llama-cpp $LL --json $R/bench-qwen3-8b-llamacpp-cuda-bf16.json
            grep -E "^(plain|chain|llama|host)" $R/bench8.log | cut -c1-200 ;;
    b27) STEP_MIN_S=60 step b27 ${B27_S:-100} python3 -P -m bloomery_cli.bench.command qwen38-mtp --shape qwen38-27b \
           --layers 16 --mtp-width 3 --device cuda -n 128 --json $R/bench-qwen38-27b-l16-mtp-cuda-bf16.json
         grep -E "^(plain|chain k=16|draft |device_accept a=0.8)|Error" $R/b27.log | cut -c1-230 ;;
    d27) for N in ${D27_N:-64}; do
           STEP_MIN_S=60 step d27-$N ${D27_S:-120} python3 -P -m bloomery_cli.bench.command qwen38-dflash2 \
             --shape qwen38-27b --layers 16 --device cuda -n $N --profile \
             --json $R/bench-qwen38-27b-l16-dflash2-n$N-cuda-bf16.json
           grep -E "^(chain k=16|draft |bound|device_accept|profile window)|Error" $R/d27-$N.log | cut -c1-230
         done ;;
    commit) step commit ${COMMIT_S:-120} python3 -P .ci/diag_commit.py -n 128 --layers 16 new old new old
            grep "^variant=" $R/commit.log | cut -c1-230 ;;
  esac
done
tar czf $OUT/fuse.tgz -C $R . && echo "records in fuse.tgz"
