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

# build (train) the bundled fixtures; on the H200 through `device`, CPU fallback
fixtures device="auto":
    bloomery fixtures build --out fixtures --device {{device}}

# check the fixtures against MANIFEST.json
fixtures-verify:
    bloomery fixtures verify

gate-qwen3-dflash *ARGS:
    bloomery gate run qwen3-dflash {{ARGS}}
