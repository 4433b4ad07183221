#!/usr/bin/env bash
# Issue 27 on the H200 through the `device` tool (never CI), one call: fewer kernels a layer. The q/k norm + RoPE
# inside the attention's split kernel (BLOOMERY_FUSE_ROPE, on in the code under test), gate/up + SiLU fused in the
# projection kernel (gemv.proj(glu=True), tiles from BLOOMERY_GEMV_CONFIGS "glu:NxK"), the gates and llama.cpp in
# the same run under the fastest setting.
# Ran once at 020c7a3 (results/h200/speed/020c7a3-fuse); both fusions measured slower and were removed after it,
# so its diag settings (rope=off, glu=) no longer parse at later commits.
#   BLOOMERY_COMMIT=<sha> [STEPS="build diag b27 gates bench8 tests"] bash .ci/device-fuse.sh   (carry .whl .llama-src)
# build   bloomery engine build --cuda --arch 90 --bench in the background (14 jobs)
# diag    .ci/diag_pdl.py at qwen3-8b: rope=off (the two kernels) against the fused RoPE, with and without glu / gu
#         tiles; one engine per setting, every setting's plain ids equal to the first's
# b27     bench qwen38-mtp at the 27B width (16 layers, MTP x3, -n 64) without and with the fastest diag setting's
#         gate/up tiles (its 34816x5120 gate/up)
# gates   bloomery gates --engine fast --device cuda --dtype bf16 under the fastest setting (records: $OUT)
# bench8  bloomery bench qwen3-dflash --shape qwen3-8b --llama-cpp under the fastest setting (cut at the call's end)
# tests   the Triton decode / gemv / chain tests on CUDA
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-585} ))
source .ci/device-setup.sh || exit 2
R=/tmp/fuse && mkdir -p $R && device_info "fuse" | tee $R/device.txt
LL=/tmp/llama-cuda
SRC=$(ls $PWD/.llama-src/*.tar.gz 2>/dev/null | head -1)
BEST="on+early+l2=4"
knobs() {  # a diag setting -> the environment the engines read (written to $R/env-<setting>.sh)
  python3 - "$1" "$R" <<'EOF'
import json, sys
s, r = sys.argv[1], sys.argv[2]
flags = s.split("+")
pdl = ",".join(f for f in flags if f.partition("=")[0] in ("on", "early", "l2")) or "off"
tiles = {}
for f in flags:
    name, _, spec = f.partition("=")
    if name in ("gu", "glu") and spec:
        t = [int(v) for v in spec.split("x")] + [1]
        for shape in ("24576x4096", "34816x5120"):
            tiles[("glu:" if name == "glu" else "") + shape] = t
env = f"export BLOOMERY_PDL={pdl} BLOOMERY_FUSE_ROPE={'off' if 'rope=off' in flags else 'on'}\n"
if tiles:
    json.dump(tiles, open(f"{r}/tiles-{s}.json", "w"))
    env += f"export BLOOMERY_GEMV_CONFIGS={r}/tiles-{s}.json\n"
else:
    env += "unset BLOOMERY_GEMV_CONFIGS\n"
open(f"{r}/env-{s}.sh", "w").write(env)
print(f"{r}/env-{s}.sh")
EOF
}
for s in ${STEPS:-build diag b27 gates bench8 tests}; do
  case $s in
    build) ( timeout 420 python3 -P -m bloomery_cli.cli engine build --out $LL --cuda --arch 90 --jobs 14 --bench \
               --source $SRC > $R/build.log 2>&1; echo "build exit $?" >> $R/build.log ) & ;;
    diag) step diag ${DIAG_S:-120} python3 -P .ci/diag_pdl.py -n 256 ${SETTINGS:-on+early+l2=4+rope=off on+early+l2=4 \
            on+early+l2=4+glu=64x128x4x4 on+early+l2=4+glu=64x128x4x3 on+early+l2=4+glu=64x256x4x2 \
            on+early+l2=4+gu=64x256x4x4 on+early+l2=4+rope=off}
          cut -c1-220 $R/diag.log
          BEST=$(grep -E "^pdl=.*chain_ids_identical=True plain_ids_same_as_first=True" $R/diag.log \
                 | sed -E 's/^pdl=([^ ]+) .*chain16 tok_s=([0-9.]+).*/\2 \1/' | sort -rn | head -1 | cut -d' ' -f2)
          BEST=${BEST:-on+early+l2=4}; echo "fastest setting: $BEST"; cat $(knobs $BEST) ;;
    b27) for v in base best; do
           ( [ $v = best ] && source $(knobs $BEST); [ $v = base ] && source $(knobs on+early+l2=4+rope=off)
             R=$R step b27-$v ${B27_S:-60} python3 -P -m bloomery_cli.bench.command qwen38-mtp --shape qwen38-27b \
               --layers 16 --mtp-width 3 --device cuda -n 64 --json $R/bench-qwen38-27b-l16-mtp-$v-cuda-bf16.json )
           grep -E "^(plain|chain k=16|draft|bound|device_accept a=0.8)|Error" $R/b27-$v.log | cut -c1-200; done ;;
    gates) ( source $(knobs $BEST); env | grep ^BLOOMERY_ | sort
             step gates ${GATES_S:-200} python3 -P -m bloomery_cli.cli gates --engine fast --device cuda --dtype bf16 \
               --results $R/fast )
           grep -E "^(PASSED|FAILED)|│" $R/gates.log | cut -c1-120 | head -20 ;;
    bench8) while ! grep -q "build exit" $R/build.log 2>/dev/null && [ $(left) -gt 60 ]; do sleep 5; done
            tail -2 $R/build.log | cut -c1-200
            ( source $(knobs $BEST); STEP_MIN_S=60 step bench8 ${BENCH8_S:-110} python3 -P -m bloomery_cli.cli bench \
                qwen3-dflash --shape qwen3-8b --device cuda --llama-cpp $LL \
                --json $R/bench-qwen3-8b-llamacpp-cuda-bf16.json )
            grep -E "^(plain|chain|llama)" $R/bench8.log | cut -c1-200 ;;
    tests) step tests ${TESTS_S:-100} python3 -P -m pytest -q -p no:cacheprovider tests/test_gemv.py tests/test_chain.py \
             tests/test_pdl.py tests/test_bench.py::test_rope_in_the_attention_equals_the_two_ops \
             tests/test_bench.py::test_triton_decode_ops_match_torch \
             tests/test_bench.py::test_cuda_graph_passes_equal_eager_passes_and_stay_lossless
           tail -3 $R/tests.log | cut -c1-200 ;;
  esac
done
tar czf $OUT/fuse.tgz -C $R . && echo "records in fuse.tgz"
