#!/usr/bin/env bash
# Makes .llama-src/llama.cpp-0c1e57098.tar.gz, the llama.cpp tree the device scripts build (device-engine.sh,
# device-fuse.sh: carry .llama-src; the device reaches no PyPI): vendor/llama.cpp of the llama-cpp-python 0.3.36
# sdist without what the driver, llama-bench and the engine gate's converter (conversion/, gguf-py/, which
# `bloomery gate run --engine llama.cpp` runs on the drafts) do not need: models, docs, tests, examples, tools/server
# and ui, the non-CUDA GPU backends. About 5 MB: the tracked tree (~57 MB) plus the carried paths must stay
# under the device tool's 64 MiB. .llama-src/ is not tracked (add it to .git/info/exclude).
#   bash .ci/llama-src.sh
set -euo pipefail
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$d"
tar xzf "$d"/llama_cpp_python-0.3.36.tar.gz -C "$d"
mkdir -p .llama-src
ex=()
for p in models docs media examples tests benches scripts .github pocs app tools/ui tools/server; do
  ex+=(--exclude="llama.cpp/$p")
done
for b in cann hexagon hip metal musa opencl openvino sycl vulkan webgpu zdnn zendnn et virtgpu; do
  ex+=(--exclude="llama.cpp/ggml/src/ggml-$b")
done
tar czf .llama-src/llama.cpp-0c1e57098.tar.gz -C "$d"/llama_cpp_python-0.3.36/vendor "${ex[@]}" llama.cpp
ls -l .llama-src/llama.cpp-0c1e57098.tar.gz
