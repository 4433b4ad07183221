#!/usr/bin/env bash
# Issue 27 on the H200 through the `device` tool (never CI), one call: the decode attention's split setting
# (BLOOMERY_ATTN_CHUNK, kernels/triton/attn_policy.py) under PDL, measured in one process per shape.
#   BLOOMERY_COMMIT=<sha> [STEPS="tests diag b27"] bash .ci/device-attn.sh          (carry .whl)
# tests  the Triton decode ops against torch and the graphed engines' lossless tests on CUDA, with one split
#        (BLOOMERY_ATTN_CHUNK=all: the split kernel writes the output) and with the default rule
# diag   .ci/diag_pdl.py at qwen3-8b: PDL on,early,l2=4 with the chunk settings in SETTINGS (plain ids must equal
#        the first setting's; chain K=16 against the read roofline)
# b27    bench qwen38-mtp at the 27B width, 16 layers, MTP x3, -n 128, PDL on,early,l2=4, chunk default and CHUNK27
#        (LAUNCH27=1: also the splits' combine as a launch of its own, decode.FUSED_COMBINE off)
# moe    bench moe at both MoE shapes with the MTP / DFlash drafts (-n 64, prompt 128, reps 9; MOE_S each)
# Records + logs: $OUT/attn (results/h200/speed/<sha>-attn takes them).
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-580} ))
source .ci/device-setup.sh || exit 2
begin attn
P=on,early,l2=4
for s in ${STEPS:-tests diag b27}; do
  case $s in
    tests) for c in all ""; do
             step tests-chunk-${c:-rule} ${TESTS_S:-90} env BLOOMERY_ATTN_CHUNK=$c python3 -P -m pytest -q -x -p no:cacheprovider \
               tests/test_bench.py tests/test_qwen38_fast.py -k "triton or cuda or graph or rollback or fast"
             tail -2 $R/tests-chunk-${c:-rule}.log | cut -c1-200; done ;;
    diag) step diag ${DIAG_S:-220} python3 -P .ci/diag_pdl.py -n 256 ${SETTINGS:-on+early+l2=4 on+early+l2=4+chunk=all \
            on+early+l2=4+chunk=256 on+early+l2=4+chunk=512 off+chunk=all on+early+l2=4}
          cut -c1-260 $R/diag.log | grep -vE "^\s*$" | tail -12 ;;
    b27) for c in "" ${CHUNK27-all}; do
           step b27-chunk-${c:-rule} 100 env BLOOMERY_PDL=$P BLOOMERY_ATTN_CHUNK=$c python3 -P -m bloomery_cli.bench.command \
             qwen38-mtp --shape qwen38-27b --layers 16 --mtp-width 3 --device cuda -n 128 \
             --json $R/bench27-l16-mtp-chunk-${c:-rule}.json
           grep -E "^(plain|chain|device_accept a=0.8|bound)|Error" $R/b27-chunk-${c:-rule}.log | cut -c1-230; done
         if [ "${LAUNCH27:-0}" = 1 ]; then
           step b27-launch 100 env BLOOMERY_PDL=$P python3 -P -c "import runpy, sys
from bloomery_gates.kernels.triton import decode
decode.FUSED_COMBINE = False
sys.argv = ['bench', 'qwen38-mtp', '--shape', 'qwen38-27b', '--layers', '16', '--mtp-width', '3', '--device', 'cuda',
            '-n', '128', '--json', '$R/bench27-l16-mtp-launch.json']
runpy.run_module('bloomery_cli.bench.command', run_name='__main__')"
           grep -E "^(plain|chain|device_accept a=0.8|bound)|Error" $R/b27-launch.log | cut -c1-230; fi ;;
    moe) for m in ${MOE_SHAPES:-qwen35moe-35b-a3b mimo2-flash}; do
           step moe-$m ${MOE_S:-200} python3 -P -m bloomery_cli.bench.command moe --shape $m --device cuda --dtype bf16 \
             -n 64 --prompt-len 128 --reps 9 --json $R/bench-moe-$m-cuda-bf16.json
           grep -E "^(plain|drafted draft=.*a=0.8|cost_policy|checks|draft |drafted ids)|Error" $R/moe-$m.log | cut -c1-230
         done ;;
  esac
done
