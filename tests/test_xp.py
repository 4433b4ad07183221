"""The reference's array namespace (reference/xp.py, issue 16): NumPy unchanged, a device bit for bit the host on
a strict fake device, CuPy within 1e-12 of NumPy where a GPU exists, bf16 rounding on the bits."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from fake_xp import FakeArray, StrictMix, fake_device
from ref_workload import calls, flat, old_reference

from bloomery_gates.reference import xp as rxp
from bloomery_gates.reference.rounding import bf16_round, emulate, st, stored_as

EMULATED = ("f64", "bf16", "f16")


def _run(call, dtype: str, emulate_in=emulate):
    """call() exactly, or under the storage rounding of ``dtype`` (of the package the call belongs to)."""
    return call() if dtype == "f64" else emulate_in(dtype, call)


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """Paths whose arrays differ in shape, dtype or any bit (NaN equal to NaN)."""
    assert a.keys() == b.keys()
    return [k for k in a if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype
            or not np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f")]


def _edges() -> np.ndarray:
    """float32 bit patterns at every rounding edge: each exponent and sign, low halves 0, 1, 0x7FFF, 0x8000, 0x8001,
    0xFFFF with even and odd kept bits, plus 10^6 random patterns."""
    hi = np.arange(1 << 9, dtype=np.uint32) << 23                     # sign + exponent
    kept = np.array([0, 1, 2, 0x7F], dtype=np.uint32) << 16             # kept mantissa bits, even and odd
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    grid = (hi[:, None, None] | kept[None, :, None] | low[None, None, :]).ravel()
    rnd = np.random.default_rng(0).integers(0, 1 << 32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([grid, rnd, np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0x7FC00000, 0x7F800001],
                                               dtype=np.uint32)])


def test_bf16_bit_rounding_is_ml_dtypes():
    """RNE on the float32 bits equals ml_dtypes' bfloat16 cast (the code st() used before), NaN kept NaN.
    (Checked once over all 2^32 patterns: 0 differ; here the edges and a random million.)"""
    f = _edges().view(np.float32)
    with np.errstate(invalid="ignore"):
        want = f.astype(ml_dtypes.bfloat16).astype(np.float32)
    got = bf16_round(f)
    nan = np.isnan(f)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def test_bf16_rounding_fails_a_planted_truncation():
    """The check above sees a rounding that truncates instead of rounding to nearest even."""
    f = _edges().view(np.float32)
    truncated = (f.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    want = f.astype(ml_dtypes.bfloat16).astype(np.float32)
    nan = np.isnan(f)
    assert not np.array_equal(truncated.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_st_equals_the_old_cast_chain(dtype):
    old = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[dtype]
    x = np.random.default_rng(3).standard_normal(100_000) * np.logspace(-30, 30, 100_000)
    with stored_as(dtype):
        got = st(x)
    assert np.array_equal(got, x.astype(np.float32).astype(old).astype(np.float64))


@pytest.fixture(scope="module")
def new_calls():
    return calls("bloomery_gates.reference")


@pytest.fixture(scope="module")
def old_pkg(tmp_path_factory):
    name = old_reference(tmp_path_factory.mktemp("old_reference"))
    if name is None:
        pytest.skip("no git history here: the pre-namespace reference (commit e2e6325) cannot be read")
    return name


@pytest.fixture(scope="module")
def old_calls(old_pkg):
    return calls(old_pkg)


# Emulated outputs changed on purpose since e2e6325 (their exact runs still equal it bit for bit): issue 30, the
# DSpark emulation stores the Markov term and base + term (and the confidence logits) as the kernel does.
EMULATION_CHANGED = {"dspark forward", "dspark forward, teacher-forced", "qwen38-dspark forward"}


@pytest.mark.parametrize("dtype", EMULATED)
def test_numpy_path_is_bit_identical_to_the_pre_namespace_reference(old_pkg, old_calls, new_calls, dtype):
    """Every family's and drafter's reference, exact and emulated: today's NumPy path equals the code of e2e6325
    (before xp) bit for bit, on the fixtures."""
    import importlib

    old_emulate = importlib.import_module(f"{old_pkg}.rounding").emulate
    assert old_calls.keys() == new_calls.keys()
    bad = {name: _same(flat(_run(old_calls[name], dtype, old_emulate)), flat(_run(new_calls[name], dtype)))
           for name in new_calls}
    moved = {k: v for k, v in bad.items() if v and k in EMULATION_CHANGED}
    assert not {k: v for k, v in bad.items() if v and k not in EMULATION_CHANGED}
    # what changed on purpose changed only where it was meant to: DSpark's Markov logits / confidence logits
    assert bool(moved) == (dtype != "f64"), moved             # the exact run did not move; bf16 / f16 did
    assert all(f.lstrip(".").split(".")[0] in ("logits", "conf_logits", "confidence", "ids", "prev")
               for v in moved.values() for f in v), moved


def test_bit_identity_sees_a_one_ulp_change(monkeypatch, old_pkg, old_calls, new_calls):
    """The bit-identity check fails when the new path moves one norm input by one ulp (a planted defect)."""
    from bloomery_gates.reference.ops import norm

    real = norm.common
    monkeypatch.setattr(norm, "common", lambda x, w: (np, np.nextafter(real(x, w)[1], np.inf), real(x, w)[2]))
    assert _same(flat(old_calls["qwen3 forward"]()), flat(new_calls["qwen3 forward"]()))


@pytest.mark.parametrize("dtype", EMULATED)
def test_a_strict_device_runs_every_reference_bit_for_bit(new_calls, dtype):
    """On the fake device (NumPy arithmetic behind CuPy's refusal to mix) every call runs through run() and
    equals the host run exactly: the weights and inputs went onto the device, and only to_host came back."""
    sel = rxp.Selection(fake_device())
    bad = {}
    with rxp.select(sel):
        for name, call in new_calls.items():
            got = rxp.run(lambda call=call: _run(call, dtype))
            assert all(isinstance(v, np.ndarray) for v in flat(got).values())
            bad[name] = _same(flat(got), flat(_run(call, dtype)))
    assert not {k: v for k, v in bad.items() if v}
    assert sel.seconds > 0


def test_both_upload_paths_give_the_host_weights_bit_for_bit(new_calls):
    """F64Weights on a card: its own upload (here a stand-in for the torch ``.to`` path: the stored values widened
    to float32 first) and, where that raises (a torch without CUDA), the host float32 upload: the same forward."""
    seen = []

    def widened(t):
        seen.append("widened")
        return FakeArray(t.detach().float().numpy().astype(np.float64))

    def broken(t):
        seen.append("broken")
        raise RuntimeError("Torch not compiled with CUDA enabled")

    want = flat(new_calls["qwen38 forward"]())
    for up in (widened, broken):            # a device name of its own: a fresh store, every weight uploaded
        with rxp.select(rxp.Selection(fake_device(upload=up, name=f"fake:{up.__name__}"))):
            assert not _same(flat(rxp.run(new_calls["qwen38 forward"])), want)
    assert seen.count("widened") > 10 and seen.count("broken") > 10


def test_the_fake_device_refuses_a_host_array_in_a_device_op():
    """The plumbing test can fail: a host mask built in the middle of a device run is refused."""
    from bloomery_gates.reference.ops.attention import attention
    dev = fake_device()
    with rxp.on(dev):
        q = dev.xp.asarray(np.ones((2, 2, 4)))
        with pytest.raises(StrictMix):
            np.tril(np.ones((2, 2), dtype=bool)) & q[0, 0, :2].astype(bool)
        with pytest.raises(StrictMix):
            np.asarray(q)
        assert attention(q, q, q, np.ones((2, 2), dtype=bool)).shape == (2, 2, 4)     # common() uploads it


def test_compare_sees_a_device_that_drops_a_term(new_calls):
    """--reference-compare's statistic: a device whose sqrt is off by 1e-9 relative (a planted defect) is over the
    1e-12 bound on the qwen3 forward; the clean fake device is at 0."""
    for plant, over in ((None, False), ({"sqrt": lambda f: lambda x, *a, **k: f(x, *a, **k) * (1 + 1e-9)}, True)):
        sel = rxp.Selection(fake_device(plant), compare=True)
        with rxp.select(sel):
            rxp.run(new_calls["qwen3 forward"])
            emulate("bf16", lambda: rxp.run(new_calls["qwen3 forward"]))
        assert sel.compared.tensors == 3 and sel.compared.skipped_emulated == 1
        assert (sel.compared.worst > 1e-12) == over, sel.compared


def _cupy_device():
    try:
        return rxp.cuda("cuda")
    except ValueError as e:
        pytest.skip(f"no CuPy GPU here: {e}")


@pytest.mark.gpu
def test_cupy_equals_numpy_to_1e12_on_every_reference(new_calls):
    """Where CuPy and a GPU exist: every family and drafter forward within 1e-12 relative of the host (the exact
    runs; ids and other integers equal)."""
    sel = rxp.Selection(_cupy_device(), compare=True)
    with rxp.select(sel):
        for name, call in new_calls.items():
            rxp.run(call, label=name)
    c = sel.compared
    assert c.tensors > 50 and c.int_differ == 0 and c.worst < 1e-12, c
