# bloomery gates: one recipe per gate, plus the suites. `just --list` shows them all.

# set up a fresh machine (torch pinned first: a range would pull a CUDA build)
setup:
    python3 -m pip install torch==2.13.0
    python3 -m pip install -e '.[dev]'

# the test suite (GPU-only tests skip with a reason on CPU)
test *ARGS:
    pytest -q {{ARGS}}

# every gate on the bundled fixtures, then a summary table
gates device="cpu" dtype="f32":
    bloomery gates --device {{device}} --dtype {{dtype}}

# every gate the fast engine (the bench's: Triton + CUDA graphs on CUDA, its torch path elsewhere) supports
gates-fast device="cpu" dtype="f32":
    bloomery gates --engine fast --device {{device}} --dtype {{dtype}}

# build (train) the bundled fixtures; on the H200 through `device`, CPU fallback
fixtures device="auto":
    bloomery fixtures build --out fixtures --device {{device}}

# check the fixtures against MANIFEST.json
fixtures-verify:
    bloomery fixtures verify

gate-qwen3-dflash *ARGS:
    bloomery gate run qwen3-dflash {{ARGS}}

gate-qwen3-dspark *ARGS:
    bloomery gate run qwen3-dspark {{ARGS}}

gate-qwen3-dflash2 *ARGS:
    bloomery gate run qwen3-dflash2 {{ARGS}}

gate-qwen3-eagle3 *ARGS:
    bloomery gate run qwen3-eagle3 {{ARGS}}

gate-qwen38-mtp *ARGS:
    bloomery gate run qwen38-mtp {{ARGS}}

gate-qwen38-dflash *ARGS:
    bloomery gate run qwen38-dflash {{ARGS}}

gate-qwen38-dflash2 *ARGS:
    bloomery gate run qwen38-dflash2 {{ARGS}}

gate-qwen38-dspark *ARGS:
    bloomery gate run qwen38-dspark {{ARGS}}

gate-mimo2-mtp *ARGS:
    bloomery gate run mimo2-mtp {{ARGS}}

gate-glm5next-mtp *ARGS:
    bloomery gate run glm5next-mtp {{ARGS}}

gate-ds4-mtp *ARGS:
    bloomery gate run ds4-mtp {{ARGS}}

gate-ds4-dspark *ARGS:
    bloomery gate run ds4-dspark {{ARGS}}

gate-ds41-dspark *ARGS:
    bloomery gate run ds41-dspark {{ARGS}}

gate-qwen4exp-mtp *ARGS:
    bloomery gate run qwen4exp-mtp {{ARGS}}

gate-qwen3yarn-dflash *ARGS:
    bloomery gate run qwen3yarn-dflash {{ARGS}}

gate-qwen3-dflash-swa *ARGS:
    bloomery gate run qwen3-dflash-swa {{ARGS}}

gate-qwen3-dflash-swa-spec *ARGS:
    bloomery gate run qwen3-dflash-swa-spec {{ARGS}}

gate-qwen35moe-dflash *ARGS:
    bloomery gate run qwen35moe-dflash {{ARGS}}

# the glm5next fixture (GLM-5.3 layout + its NextN layer), trained through transformers' Glm5NextTextModel, ~8-15 min
fixtures-glm5next:
    OMP_NUM_THREADS=1 python -m bloomery_cli.families.glm5next.fixture --out fixtures

# the mimo2 fixture (MiMo-V2-Flash layout + its 3 MTP layers), ~25 min on 2 busy CPU cores
fixtures-mimo2:
    OMP_NUM_THREADS=1 python -m bloomery_cli.families.mimo2.fixture --out fixtures

# the deepseek4 fixture (DeepSeek V4 layout + its in-file MTP block), ~8 min on 2 busy CPU cores
fixtures-ds4:
    OMP_NUM_THREADS=1 python -m bloomery_cli.families.deepseek4.fixture --out fixtures

# the deepseek4 GGUF pair llama.cpp runs (ds4-tiny-lc.gguf + mtp-ds4-tiny-lc.gguf, derived from ds4-tiny: HCA rate 128,
# indexer width 64; llama.cpp's converter layout, MXFP4 experts), seconds
fixtures-ds4-gguf:
    OMP_NUM_THREADS=1 python -m bloomery_cli.families.deepseek4.fixture_gguf --out fixtures

# the deepseek41 fixture (DeepSeek V4.1 in the seed engine's GGUF layout, docs/V41.md), ~10 min on 2 busy CPU cores
fixtures-ds41:
    OMP_NUM_THREADS=1 python -m bloomery_cli.families.deepseek41.fixture --out fixtures

# the ds41-dspark draft (the seed's V4.1 DSpark, FAMILIES_MOE.md 5.2) distilled from ds41-tiny, ~1 min
fixtures-ds41-dspark:
    OMP_NUM_THREADS=1 python -m bloomery_cli.families.deepseek41.fixture_dspark --out fixtures

gate-qwen35moe-mtp *ARGS:
    bloomery gate run qwen35moe-mtp {{ARGS}}

# decode speed at the Qwen3-8B shape on the H200: roofline, verify cost, drafted speed, HF transformers
bench-qwen3-8b:
    bloomery bench qwen3-dflash --shape qwen3-8b --device cuda --json results/h200/bench-qwen3-8b-cuda-bf16.json

# the bench on the fixtures (any device)
bench-fixtures device="auto":
    bloomery bench qwen3-dflash --device {{device}}

# DFlash2's fused conv / selector kernels against the torch path and the bandwidth floor (H200)
bench-dflash2-kernels:
    python3 -m bloomery_cli.bench.dflash2 --device cuda --json results/h200/bench-dflash2-kernels.json

# regenerate results/<device>/README.md, their index results/README.md and the plots from the committed records
results:
    bloomery results

# tier 3 on the GGUF fixtures: llama.cpp (llama-cpp-python 0.3.36) beside transformers; CPU f32 records and logs
oracle-llamacpp:
    #!/usr/bin/env bash
    set -euo pipefail
    bloomery gate run qwen3-dflash --target "$(bloomery fixtures derive qwen3-tiny.gguf)" --oracle \
        --json results/cpu/qwen3-dflash-gguf-oracle-cpu-f32.json | tee results/cpu/qwen3-dflash-gguf-oracle-cpu-f32.log
    bloomery gate run qwen38-mtp --target fixtures/qwen38-tiny.gguf --draft fixtures/qwen38-tiny.gguf --oracle \
        --json results/cpu/qwen38-mtp-gguf-oracle-cpu-f32.json | tee results/cpu/qwen38-mtp-gguf-oracle-cpu-f32.log

# tier 3 on the qwen35moe GGUF layout (not bundled: over the fixtures' size cap), written from the trained HF fixture
oracle-llamacpp-qwen35moe:
    #!/usr/bin/env bash
    set -euo pipefail
    mkdir -p .fixtures-work
    python -m bloomery_cli.families.qwen35moe.fixture --out fixtures --gguf-only --gguf-out .fixtures-work/qwen35moe-tiny.gguf
    bloomery gate run qwen35moe-mtp --target .fixtures-work/qwen35moe-tiny.gguf \
        --draft .fixtures-work/qwen35moe-tiny.gguf --oracle --json results/cpu/qwen35moe-mtp-gguf-oracle-cpu-f32.json \
        | tee results/cpu/qwen35moe-mtp-gguf-oracle-cpu-f32.log

# tier 3 on the mimo2 GGUF layout (bundled: fixtures/mimo2-tiny.gguf, rewritten from the HF fixture by
# `python -m bloomery_cli.families.mimo2.fixture_gguf --out fixtures`): llama.cpp's trunk and its 3 chained MTP layers
oracle-llamacpp-mimo2:
    #!/usr/bin/env bash
    set -euo pipefail
    bloomery gate run mimo2-mtp --target fixtures/mimo2-tiny.gguf --draft fixtures/mimo2-tiny.gguf --oracle \
        --json results/cpu/mimo2-mtp-gguf-oracle-cpu-f32.json | tee results/cpu/mimo2-mtp-gguf-oracle-cpu-f32.log

# tier 3 on the qwen4exp and glm5next GGUF trunks (bundled: fixtures/{qwen4exp,glm5next}-tiny.gguf, rewritten from the
# HF fixtures by `python -m bloomery_cli.families.<family>.fixture_gguf --out fixtures`); docs/ORACLES.md
oracle-llamacpp-moe-hc:
    #!/usr/bin/env bash
    set -euo pipefail
    bloomery gate run qwen4exp-mtp --target fixtures/qwen4exp-tiny.gguf --oracle \
        --json results/cpu/qwen4exp-mtp-gguf-oracle-cpu-f32.json | tee results/cpu/qwen4exp-mtp-gguf-oracle-cpu-f32.log
    bloomery gate run glm5next-mtp --target fixtures/glm5next-tiny.gguf --draft fixtures/glm5next-tiny.gguf --oracle \
        --json results/cpu/glm5next-mtp-gguf-oracle-cpu-f32.json | tee results/cpu/glm5next-mtp-gguf-oracle-cpu-f32.log

# tier 3 on the deepseek4 GGUF pair (`just fixtures-ds4-gguf`): transformers and llama.cpp's trunk past position 128 (HCA),
# llama.cpp's V4 MTP graph from the separate MTP file; then llama.cpp's own draft-mtp under the gate
oracle-llamacpp-deepseek4:
    #!/usr/bin/env bash
    set -euo pipefail
    bloomery gate run ds4-mtp --target fixtures/ds4-tiny-lc.gguf --draft fixtures/mtp-ds4-tiny-lc.gguf --oracle \
        --json results/cpu/ds4-mtp-gguf-oracle-cpu-f32.json | tee results/cpu/ds4-mtp-gguf-oracle-cpu-f32.log
    bloomery gate run ds4-mtp --engine llama.cpp --device cpu --dtype f32 \
        --json results/cpu/ds4-mtp-llamacpp-cpu-f32.json | tee results/cpu/ds4-mtp-llamacpp-cpu-f32.log
