#!/usr/bin/env bash
# Issue 23 (and 30) on the H200 through the `device` tool (never CI), one call under the tool's 10 minutes:
#   BLOOMERY_COMMIT=<sha> [STEPS="dspark build gates bench8 bench27"] bash .ci/device-engine.sh
#   carry: .whl (gguf, sentencepiece wheels) and .llama-src (a trimmed llama.cpp tree of the 0.3.36 sdist, made by
#   `bash .ci/llama-src.sh`: the machine reaches no PyPI)
# dspark   issue 30: bloomery gate run qwen38-dspark --device cuda --dtype bf16 (ours), beside the build
# build    bloomery engine build --cuda --arch 90 --bench into .llama/cuda (driver + llama-bench, about 6 min)
# gates    bloomery gates --engine llama.cpp --device cuda --dtype bf16 (records under $OUT)
# mimo2    bloomery gate run mimo2-mtp --engine llama.cpp --device cuda --dtype bf16 (the pair the first gates call
#          had no replay for)
# bench8   bloomery bench qwen3-dflash --shape qwen3-8b --llama-cpp .llama/cuda (llama.cpp in the same run)
# bench27  bloomery bench qwen38-dflash2 --shape qwen38-27b --layers 16 --llama-cpp .llama/cuda (16 layers: the
#          disk holds the 27B GGUF's 16 layers beside the rest, not all 64)
# Records + logs: one tar in $OUT.
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-575} ))
source .ci/device-setup.sh || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/sentencepiece-*.whl || exit 2
R=/tmp/engine && mkdir -p $R
export STEP_MIN_S=30
device_info "engine" | tee $R/device.txt
LL=/tmp/llama-cuda                # outside the repo copy: a re-laid working tree can drop ignored folders
SRC=$(ls $PWD/.llama-src/*.tar.gz | head -1)
for s in ${STEPS:-dspark build gates bench8}; do
  case $s in
    dspark) ( timeout 300 python3 -P -m bloomery_cli.cli gate run qwen38-dspark --device cuda --dtype bf16 \
                --json $R/qwen38-dspark-cuda-bf16.json > $R/dspark.log 2>&1; echo "dspark exit $?" >> $R/dspark.log ) & ;;
    build) step build ${BUILD_S:-420} python3 -P -m bloomery_cli.cli engine build --out $LL --cuda --arch 90 --jobs 15 --bench \
             --source $SRC; tail -4 $R/build.log; tail -5 $LL/build.log 2>/dev/null | cut -c1-200 ;;
    gates) step gates ${GATES_S:-200} python3 -P -m bloomery_cli.cli gates --engine llama.cpp --llama-cpp $LL --device cuda \
             --dtype bf16 --results $R/gates; tail -22 $R/gates.log | cut -c1-200 ;;
    mimo2) step mimo2 ${MIMO2_S:-150} python3 -P -m bloomery_cli.cli gate run mimo2-mtp --engine llama.cpp --llama-cpp $LL \
             --device cuda --dtype bf16 --json $R/mimo2-mtp-llamacpp-cuda-bf16.json \
             --record $R/mimo2-mtp-llamacpp-cuda-bf16.jsonl; tail -30 $R/mimo2.log | cut -c1-200 ;;
    bench8) step bench8 240 python3 -P -m bloomery_cli.cli bench qwen3-dflash --shape qwen3-8b --device cuda \
              --llama-cpp $LL --json $R/bench-qwen3-8b-llamacpp-cuda-bf16.json; grep -E "^(plain|llama)" $R/bench8.log ;;
    bench27) step bench27 240 python3 -P -m bloomery_cli.cli bench qwen38-dflash2 --shape qwen38-27b --layers 16 \
               --device cuda --llama-cpp $LL --json $R/bench-qwen38-27b-l16-llamacpp-cuda-bf16.json
             grep -E "^(plain|llama)" $R/bench27.log ;;
  esac
done
wait
grep -E "PASSED|FAILED|worst rel .*markov|exit" $R/dspark.log 2>/dev/null | cut -c1-200
tar czf $OUT/engine.tgz -C $R . && echo "records in engine.tgz"
