#!/usr/bin/env bash
# Issue 27 on the H200 through the `device` tool (never CI): the 8B step with the narrow projections' tiles varied
# in-step (BLOOMERY_GEMV_CONFIGS), fewer pipeline stages or smaller K tiles, so that less shared memory a program
# may let the next kernel's programs become resident early under PDL (isolated sweeps cannot see that).
#   BLOOMERY_COMMIT=<sha> [TILES="base s3 s2 k128s4 k128s6 base"] bash .ci/device-tiles.sh     (carry .whl)
# TILES also takes down-sS / o-sS / qkv-sS (that shape in S splits) and l2=MB (BLOOMERY_PDL=on,early,l2=MB).
# Each variant: one process, .ci/diag_ceiling.py -n 256 base at qwen3-8b (chained plain decode K = 16). Logs: $OUT.
set -uo pipefail
T0=$(date +%s); DEADLINE=$(( T0 + ${DEADLINE_S:-300} ))
source .ci/device-setup.sh || exit 2
R=$OUT/tiles && mkdir -p $R && device_info "tiles" | tee $R/device.txt
cfg() {  # variant -> JSON of the three narrow 8B shapes' tiles [BN, BK, warps, stages, splits, tma]
  case $1 in
    s3) echo '{"6144x4096": [64,256,4,3,1,1], "4096x4096": [64,256,4,3,1,1], "4096x12288": [64,256,4,3,2,1]}' ;;
    s2) echo '{"6144x4096": [64,256,4,2,1,1], "4096x4096": [64,256,4,2,1,1], "4096x12288": [64,256,4,2,2,1]}' ;;
    k128s4) echo '{"6144x4096": [64,128,4,4,1,1], "4096x4096": [64,128,4,4,1,1], "4096x12288": [64,128,4,4,2,1]}' ;;
    k128s6) echo '{"6144x4096": [64,128,4,6,1,1], "4096x4096": [64,128,4,6,1,1], "4096x12288": [64,128,4,6,2,1]}' ;;
    down-s*) echo "{\"4096x12288\": [64,256,4,4,${1#down-s},1]}" ;;
    o-s*) echo "{\"4096x4096\": [64,256,4,4,${1#o-s},1]}" ;;
    qkv-s*) echo "{\"6144x4096\": [64,256,4,4,${1#qkv-s},1]}" ;;
    *) echo '{}' ;;                    # base, l2=MB (the default tiles)
  esac
}
i=0
for v in ${TILES:-base s3 s2 k128s4 k128s6 base}; do i=$((i + 1))
  cfg $v > $R/$i-$v.json
  ( export BLOOMERY_GEMV_CONFIGS=$R/$i-$v.json; case $v in l2=*) export BLOOMERY_PDL=on,early,$v ;; esac
    step $i-$v 60 python3 -P .ci/diag_ceiling.py -n 256 base )
  echo "$v: $(grep '^skip=' $R/$i-$v.log | cut -c1-170)"
done
