# Sourced by every .ci/device-*.sh (on the H200 through the `device` tool, never by CI): installs the carried gguf
# wheel and the package beside the machine's own torch, exports the paths and the environment every process
# there gets (NVLink multicast off), and defines `device_info` (date, commit, GPU, torch / triton versions).
# Usage: source .ci/device-setup.sh || exit 2      (carry .whl with the gguf wheel; pass BLOOMERY_COMMIT=<sha>)
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/gguf-*.whl || return 2
PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/pkg . \
  || return 2
export PYTHONPATH=/tmp/pkg:/tmp/site BLOOMERY_FIXTURES=$PWD/fixtures PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
device_info() {
  date -u +%FT%TZ
  echo "commit ${BLOOMERY_COMMIT:-unknown (pass BLOOMERY_COMMIT: the device copy git HEAD lags its tree)} $*"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -P -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
}
# The step runner of the device-*.sh scripts: each sets DEADLINE (epoch seconds) and R (the log folder) first.
left() { echo $(( DEADLINE - $(date +%s) )); }
step() {  # name limit cmd...: run under min(limit, left - 10); skipped when under STEP_MIN_S (default 40) remain
  local name=$1 lim=$2; shift 2
  local l; l=$(left); [ $l -lt ${STEP_MIN_S:-40} ] && { echo "$name skipped: ${l}s left"; return; }
  [ $(( l - 10 )) -lt $lim ] && lim=$(( l - 10 ))
  local t=$(date +%s)
  timeout $lim "$@" > $R/$name.log 2>&1; echo "$name exit $? in $(( $(date +%s) - t ))s"
}
begin() {  # name: the log folder R (${R_DIR:-$OUT/name}) and its device.txt (date, commit, GPU, versions)
  R=${R_DIR:-$OUT/$1} && mkdir -p $R && device_info "$1" | tee $R/device.txt
}
