"""The emulated band model (bloomery_cli.bands.emulated_band, reference/rounding.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from bloomery_cli.bands import (
    M_RMS,
    M_WORST,
    SMALL_N,
    Op,
    accumulation_term,
    emulated_band,
    ratio_quantiles,
    rel_rms,
    small_tap,
    worst_rel,
)
from bloomery_gates.reference.families.qwen3 import model as ref_qwen3
from bloomery_gates.reference.rounding import emulate, st, stored_as


def test_st_is_the_identity_outside_the_context():
    x = np.random.default_rng(0).standard_normal(16)
    assert st(x) is x


@pytest.mark.parametrize(("dtype", "np_type"), [("bf16", ml_dtypes.bfloat16), ("f16", np.float16),
                                                ("f32", np.float32)])
def test_st_rounds_to_the_storage_dtype_inside(dtype, np_type):
    x = np.random.default_rng(1).standard_normal(1000)
    with stored_as(dtype):
        y = st(x)
    assert np.array_equal(y, y.astype(np_type).astype(np.float64))       # representable in the storage type
    assert 0 < np.max(np.abs(y - x) / np.abs(x)) <= 2.0 ** -{"bf16": 8, "f16": 11, "f32": 24}[dtype]
    assert st(x) is x                                                      # the context is gone again


def test_emulated_forward_deviates_by_the_dtype(tiny_target):
    ids = list(range(1, 17))
    exact = ref_qwen3.forward(tiny_target, ids).logits
    again = ref_qwen3.forward(tiny_target, ids).logits
    assert np.array_equal(exact, again)                                    # no state leaks out of a context
    dev = {d: worst_rel(emulate(d, lambda: ref_qwen3.forward(tiny_target, ids)).logits, exact)
           for d in ("f32", "f16", "bf16")}
    assert 0 < dev["f32"] < 1e-5 < dev["f16"] < dev["bf16"] < 0.1
    assert np.array_equal(ref_qwen3.forward(tiny_target, ids).logits, exact)


def test_emulated_band_is_the_stated_multiple():
    rng = np.random.default_rng(2)
    exact = rng.standard_normal((8, 64))
    emu = exact * (1 + 2.0 ** -9 * rng.standard_normal(exact.shape))
    ops = [Op("proj", 64), Op("add", 1)]
    band = emulated_band("bf16", exact, emu, "t", ops)
    acc = accumulation_term("bf16", ops)
    assert band.value == pytest.approx(M_WORST * (worst_rel(emu, exact) + acc))
    assert band.rms == pytest.approx(M_RMS * (rel_rms(emu, exact) + acc))
    assert acc == pytest.approx((8 + 1) * 2.0 ** -24)
    assert band.contains(worst_rel(emu, exact), rel_rms(emu, exact))
    shifted = exact * (1 + 2 * 2.0 ** -8)                                  # a systematic 0.8% scale: rms sees it
    assert worst_rel(shifted, exact) < band.value and not band.contains(worst_rel(shifted, exact),
                                                                          rel_rms(shifted, exact))


def test_small_taps_get_the_sampling_quantile_and_large_ones_keep_the_multiples():
    """q(n) of the two ratio statistics falls under M_WORST / M_RMS by n = SMALL_N (so taps of SMALL_N or more
    entries keep the stated multiples), and at n = 7 equals sqrt(F_{0.999}(7, 7)) = sqrt(14.99) for rel_rms."""
    qw, qr = ratio_quantiles(SMALL_N)
    assert qw < M_WORST and qr < M_RMS
    assert small_tap(SMALL_N) == small_tap(4096) == (M_WORST, M_RMS)
    w7, r7 = small_tap(7)
    assert r7 == pytest.approx(14.99 ** 0.5, rel=0.03) and w7 > M_WORST
    rng = np.random.default_rng(3)
    exact = rng.standard_normal(7)
    emu = exact * (1 + 2.0 ** -9 * rng.standard_normal(7))
    band = emulated_band("bf16", exact, emu, "conf", [Op("proj", 64)])
    acc = accumulation_term("bf16", [Op("proj", 64)])
    assert band.rms == pytest.approx(r7 * (rel_rms(emu, exact) + acc)) and "small_tap" in band.derivation
