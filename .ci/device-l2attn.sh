#!/usr/bin/env bash
# Issue 27 on the H200 through the `device` tool (never CI), one call: the L2 budget of the projection after the
# attention (BLOOMERY_PDL's l2attn), where the 27B MTP draft's time goes, and llama.cpp in the same run.
#   BLOOMERY_COMMIT=<sha> [STEPS="build diag prof27 bench8"] bash .ci/device-l2attn.sh
#   carry: .whl (gguf) and .llama-src (the trimmed llama.cpp tree of the 0.3.36 sdist, as .ci/device-engine.sh)
# build   bloomery engine build --cuda --arch 90 --bench, in the background (14 jobs) while diag and prof27 run
# diag    .ci/diag_pdl.py at qwen3-8b over SETTINGS (default l2=4 against l2attn=12/20/28, l2=4 again): one engine
#         per setting, chain K=16 against the read roofline, every setting's plain ids equal to the first's
# prof27  bloomery bench qwen38-mtp --shape qwen38-27b --layers 16 --mtp-width 3 -n 64 --profile (the MTP draft's
#         block by kernel)
# bench8  bloomery bench qwen3-dflash --shape qwen3-8b --llama-cpp (ours and llama.cpp in the same run) under the
#         diag's fastest setting (its chain16 tok/s), cut at the call's end (the record is saved stage by stage:
#         plain, chain and llama.cpp come first)
# Logs and records: $OUT/l2attn.tgz.
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-585} ))
source .ci/device-setup.sh || exit 2
R=/tmp/l2attn && mkdir -p $R && device_info "l2attn" | tee $R/device.txt
LL=/tmp/llama-cuda
SRC=$(ls $PWD/.llama-src/*.tar.gz 2>/dev/null | head -1)
BEST=""
for s in ${STEPS:-build diag prof27 bench8}; do
  case $s in
    build) ( timeout 420 python3 -P -m bloomery_cli.cli engine build --out $LL --cuda --arch 90 --jobs 14 --bench \
               --source $SRC > $R/build.log 2>&1; echo "build exit $?" >> $R/build.log ) & ;;
    diag) step diag ${DIAG_S:-170} python3 -P .ci/diag_pdl.py -n 256 \
            ${SETTINGS:-on+early+l2=4 on+early+l2=4+l2attn=12 on+early+l2=4+l2attn=20 on+early+l2=4+l2attn=28 on+early+l2=4}
          cut -c1-220 $R/diag.log
          BEST=$(grep -E "^pdl=.*chain_ids_identical=True plain_ids_same_as_first=True" $R/diag.log \
                 | sed -E 's/^pdl=([^ ]+) .*chain16 tok_s=([0-9.]+).*/\2 \1/' | sort -rn | head -1 | cut -d' ' -f2)
          echo "fastest setting: ${BEST:-none}" ;;
    prof27) step prof27 ${PROF_S:-130} python3 -P -m bloomery_cli.bench.command qwen38-mtp --shape qwen38-27b --layers 16 \
              --mtp-width 3 --device cuda -n 64 --profile --json $R/profile-qwen38-27b-l16-mtp-cuda-bf16.json
            grep -E "^(plain|chain k=16|draft|bound|profile draft|device_accept a=0.8)" $R/prof27.log | cut -c1-200
            grep -A16 "^profile draft" $R/prof27.log | cut -c1-160 ;;
    bench8) while ! grep -q "build exit" $R/build.log 2>/dev/null && [ $(left) -gt 60 ]; do sleep 5; done
            tail -3 $R/build.log | cut -c1-200
            PDLSET=$(echo "${BEST:-on+early+l2=4}" | tr + ,)
            echo "bench8 under BLOOMERY_PDL=$PDLSET"
            STEP_MIN_S=60 step bench8 600 env BLOOMERY_PDL=$PDLSET python3 -P -m bloomery_cli.cli bench qwen3-dflash \
              --shape qwen3-8b --device cuda --llama-cpp $LL --json $R/bench-qwen3-8b-llamacpp-cuda-bf16.json
            grep -E "^(plain|chain|llama)" $R/bench8.log | cut -c1-200 ;;
  esac
done
tar czf $OUT/l2attn.tgz -C $R . && echo "records in l2attn.tgz"
