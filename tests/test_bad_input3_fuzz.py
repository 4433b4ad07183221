"""Issue 28: the readers under property-based fuzzing (hypothesis). For every generated input a reader either
reads it or raises ``InputError`` (the CLI's one exit-2 line); nothing else escapes, no example allocates past
``BOUND`` bytes (tracemalloc peak, Python-level allocations) and none runs past the deadline. A bounded number
of examples per reader keeps each test under ~20 s on 2 shared cores.

Readers: safetensors headers (hf_dir's mmap reader, plan's byte reader, inventory), GGUF headers and metadata
(``GGUFFile``, the target loader), config.json (the qwen3 reader through ``load_target``), the prompts file
(``read_prompts``) and results records (``results_schema`` and the whole `bloomery results` command)."""

from __future__ import annotations

import json
import shutil
import struct
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest_formats import make_qwen3_gguf, make_qwen3_hf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bloomery_gates.errors import InputError

BOUND = 64 << 20
FUZZ = settings(max_examples=60, deadline=2000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
RESULTS = Path(__file__).resolve().parents[1] / "results"

# JSON values, edge cases weighted in: huge and negative ints, non-finite floats (Python's JSON takes them),
# denormals, strings, nesting
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([0, -1, 10**400, 2**63]),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([5e-324, 1e308, -0.0]),
                    st.text(max_size=12))
JSON = st.recursive(SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                     st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                    max_leaves=12)


@contextmanager
def bounded():
    """The example runs under tracemalloc; its Python-level peak must stay under BOUND."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < BOUND, f"{peak} bytes allocated (bound {BOUND})"


def reads_or_refuses(fn, *args):
    with bounded():
        try:
            return fn(*args)
        except InputError as e:
            assert "\n" not in str(e), str(e)
            return None


# --- config.json ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> Path:
    d, _ = make_qwen3_hf(tmp_path_factory.mktemp("q") / "target")
    return d


CONFIG_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta", "max_position_embeddings",
               "tie_word_embeddings", "hidden_act", "attention_bias", "model_type", "rope_parameters",
               "rope_scaling", "layer_types", "sliding_window", "torch_dtype"]
YARN_KEYS = ["factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
             "mscale_all_dim", "truncate", "rope_theta"]


@FUZZ
@given(key=st.sampled_from(CONFIG_KEYS), value=JSON, yarn=st.booleans(), ykey=st.sampled_from(YARN_KEYS),
       yvalue=JSON)
def test_fuzz_config_json(qwen3_dir, tmp_path_factory, key, value, yarn, ykey, yvalue):
    from bloomery_cli.loading import load_target

    d = tmp_path_factory.mktemp("c")
    for f in qwen3_dir.iterdir():
        (d / f.name).symlink_to(f)
    cfg = json.loads((qwen3_dir / "config.json").read_text())
    cfg[key] = value
    if yarn:
        cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                  ykey: yvalue}
    (d / "config.json").unlink()
    (d / "config.json").write_text(json.dumps(cfg))
    spec = reads_or_refuses(load_target, d)
    if spec is not None and spec.layer.rope_scaling is not None:   # what was read must be usable by the math
        import numpy as np

        from bloomery_gates.reference.ops.rope import attention_factor, inv_freq
        f = inv_freq(spec.layer.head_dim, spec.layer.rope_theta, spec.layer.rope_scaling)
        assert np.isfinite(f).all() and attention_factor(spec.layer.rope_scaling) > 0


NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70),
                    st.sampled_from([0, 1, 1.0000001, 5e-324, 1e-300, 1e300, 10**400, 2**40 + 1]))


@FUZZ
@given(ykey=st.sampled_from(YARN_KEYS[:-1]), yvalue=NUMBERS, theta=NUMBERS)
def test_fuzz_yarn_numbers(qwen3_dir, tmp_path_factory, ykey, yvalue, theta):
    """yarn's numbers and the RoPE base: whatever the reader takes, the math turns into finite frequencies."""
    from bloomery_cli.loading import load_target

    d = tmp_path_factory.mktemp("y")
    for f in qwen3_dir.iterdir():
        (d / f.name).symlink_to(f)
    cfg = json.loads((qwen3_dir / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                              "rope_theta": theta, ykey: yvalue}
    cfg.pop("rope_theta")
    (d / "config.json").unlink()
    (d / "config.json").write_text(json.dumps(cfg))
    spec = reads_or_refuses(load_target, d)
    if spec is not None:
        import numpy as np

        from bloomery_gates.reference.ops.rope import attention_factor, inv_freq
        f = inv_freq(spec.layer.head_dim, spec.layer.rope_theta, spec.layer.rope_scaling)
        assert np.isfinite(f).all() and np.isfinite(attention_factor(spec.layer.rope_scaling))


# --- the prompts file ----------------------------------------------------------------------------------------

PROMPT_LINES = st.one_of(JSON.map(json.dumps), st.fixed_dictionaries({"ids": JSON}).map(json.dumps),
                         st.fixed_dictionaries({"ids": st.lists(st.integers(-5, 10**20), max_size=6)}).map(json.dumps),
                         st.text(max_size=20))


@FUZZ
@given(lines=st.lists(PROMPT_LINES, min_size=0, max_size=5), raw=st.binary(max_size=16))
def test_fuzz_prompts(tmp_path_factory, lines, raw):
    from bloomery_cli.prompts import read_prompts

    p = tmp_path_factory.mktemp("p") / "p.jsonl"
    p.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + raw)

    def no_tokenizer():
        raise InputError(p, "a text prompt needs the tokenizer (none in this test)")

    got = reads_or_refuses(read_prompts, p, no_tokenizer, None, 64)
    if got is not None:
        assert all(0 <= i < 64 for prompt in got for i in prompt)


# --- safetensors headers -------------------------------------------------------------------------------------

DTYPES = st.sampled_from(["F32", "F16", "BF16", "I64", "U8", "F8_E4M3", "XX", ""])
DIMS = st.one_of(st.integers(0, 8), st.sampled_from([10**6, 10**12, 2**63, -1]))
ENTRY = st.one_of(st.fixed_dictionaries({"dtype": DTYPES, "shape": st.lists(DIMS, max_size=3),
                                         "data_offsets": st.lists(st.integers(-1, 10**13), min_size=2, max_size=2)}),
                  JSON)


@FUZZ
@given(header=st.dictionaries(st.sampled_from(["model.embed_tokens.weight", "lm_head.weight", "__metadata__", "x"]),
                              ENTRY, max_size=3),
       declared=st.one_of(st.none(), st.sampled_from([0, 1, 7, 2**40, 2**64 - 1])),
       payload=st.binary(max_size=64))
def test_fuzz_safetensors_header(tmp_path_factory, header, declared, payload):
    from bloomery_cli.formats.hf_dir import SafetensorsTensors
    from bloomery_cli.inventory import inventory
    from bloomery_cli.plan.headers import _header

    body = json.dumps(header).encode()
    f = tmp_path_factory.mktemp("s") / "model.safetensors"
    f.write_bytes(struct.pack("<Q", len(body) if declared is None else declared) + body + payload)

    def via_mmap():
        t = SafetensorsTensors([f])
        for name in t:
            t.shape_of(name), t.dtype_of(name)
            t.check_dtype(name)
        return t

    reads_or_refuses(via_mmap)
    reads_or_refuses(_header, f)
    reads_or_refuses(inventory, [f])


# --- GGUF headers and metadata -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    path, _ = make_qwen3_gguf(tmp_path_factory.mktemp("g") / "t.gguf")
    return path.read_bytes()


@FUZZ
@given(cuts=st.lists(st.tuples(st.integers(0, 4095), st.binary(min_size=1, max_size=8)), max_size=4),
       length=st.one_of(st.none(), st.integers(0, 4096)))
def test_fuzz_gguf_header(gguf_bytes, tmp_path_factory, cuts, length):
    """Bytes of the header and metadata region (the first 4 KiB) overwritten, or the file cut short."""
    from bloomery_cli.formats.gguf_file import GGUFFile
    from bloomery_cli.loading import load_target

    data = bytearray(gguf_bytes)
    for at, new in cuts:
        data[at:at + len(new)] = new
    if length is not None:
        data = data[:length]
    f = tmp_path_factory.mktemp("g") / "t.gguf"
    f.write_bytes(bytes(data))

    def meta():
        g = GGUFFile(f)
        return [g.meta(k, None) for k in g.meta_keys()] + g.tensor_names()

    reads_or_refuses(meta)
    reads_or_refuses(load_target, f)


# --- results records -----------------------------------------------------------------------------------------

def _paths(obj, at=()):
    yield at
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*at, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            yield from _paths(v, (*at, i))


SAMPLES = sorted(p for p in (RESULTS / "cpu").glob("*.json"))[:: max(1, len(list((RESULTS / "cpu").glob("*.json")))
                                                                     // 6)]


@settings(max_examples=40, deadline=5000, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(which=st.sampled_from(SAMPLES), pick=st.integers(0, 10**6), value=JSON)
def test_fuzz_results_record(tmp_path_factory, which, pick, value):
    """A committed record with one value (anywhere in it) replaced: `bloomery results` tabulates it (exit 0) or
    names it (exit 2, one line, nothing written). Never a traceback."""
    from bloomery_cli.cli import app

    rec = json.loads(which.read_text())
    paths = [p for p in _paths(rec) if p]
    at = paths[pick % len(paths)]
    node = rec
    for k in at[:-1]:
        node = node[k]
    node[at[-1]] = value
    root = tmp_path_factory.mktemp("r")
    (root / "cpu").mkdir()
    (root / "cpu" / which.name).write_text(json.dumps(rec))
    r = CliRunner().invoke(app, ["results", "--dir", str(root), "--no-plots"], catch_exceptions=True)
    assert r.exception is None or isinstance(r.exception, SystemExit), (at, value, repr(r.exception))
    assert r.exit_code in (0, 2), (at, value, r.output)
    assert "Traceback" not in r.output
    if r.exit_code == 2:
        assert len(r.output.strip().splitlines()) == 1 and which.name in r.output, r.output
        assert sorted(p.name for p in root.rglob("*")) == ["cpu", which.name], "written before refusing"
    shutil.rmtree(root)
