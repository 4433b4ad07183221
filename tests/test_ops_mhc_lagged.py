"""DeepSeek V4.1's lagged hyper-connection mixes and the LastMix collapse (docs/V41.md section 4): the reference's
definitions (one-hot first fold, the lag is the previous sublayer's pre, the pack round trip), the device op
against the reference through the gates' (r) lines (bf16 and f32, emulated bands), the reference on the strict fake
device, and the FAIL-first plants in bf16: a lagged mix applied unlagged (each sublayer folded by its own pre, as
V4), the LastMix collapse replaced by the first stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ops_check import check, fails_only, on_fake_device, report, stored

from bloomery_cli.bands import Op
from bloomery_gates.kernels.ops import mhc as kmhc
from bloomery_gates.kernels.ops import mhc_lagged as klag
from bloomery_gates.reference.ops import mhc as rmhc
from bloomery_gates.reference.ops import mhc_lagged as rlag
from bloomery_gates.reference.rounding import linear

H, S, N, ITERS, EPS, NORM_EPS = 64, 4, 40, 20, 1e-6, 1e-6
P = (2 + S) * S
SUBLAYERS = 3


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Streams that differ (so the fold's weights matter), and three sublayers' mixes and stand-in blocks."""
    g = torch.Generator().manual_seed(seed)

    def r(*s, sc=0.3):
        return torch.randn(*s, generator=g) * sc

    out = {"x": r(N, 1, H, sc=1.0) + r(N, S, H, sc=0.7)}
    for k in range(SUBLAYERS):
        out |= {f"fn{k}": r(P, S * H, sc=0.2), f"base{k}": r(P, sc=0.5), f"scale{k}": 1.0 + r(3, sc=0.1),
                f"block{k}": r(H, H, sc=0.2)}
    return out


def as_dtype(w: dict[str, torch.Tensor], dtype: str) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """x and the blocks in the run dtype; the mixes' fn, base, scale stay float32 (the converter's F32)."""
    out = {k: stored(v, dtype if k == "x" or k.startswith("block") else "f32") for k, v in w.items()}
    return {k: p[0] for k, p in out.items()}, {k: p[1] for k, p in out.items()}


def k_chain(kw: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """SUBLAYERS lagged sublayers from the one-hot lag, each tap packed and unpacked, then LastMix -> (tap, head)."""
    x = kw["x"]
    state = klag.pack_lag(x, klag.lag_init(x))
    for k in range(SUBLAYERS):
        x, lag = klag.unpack_lag(state)
        x, pre = klag.lagged_sublayer(x, lag, kw[f"fn{k}"], kw[f"base{k}"], kw[f"scale{k}"], ITERS, EPS, NORM_EPS,
                                      lambda a, k=k: F.linear(a, kw[f"block{k}"]))
        state = klag.pack_lag(x, pre)
    x, lag = klag.unpack_lag(state)
    return state, klag.last_mix(x, lag)


def r_chain(f: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    x = f["x"]
    state = rlag.pack_lag(x, rlag.lag_init(x))
    for k in range(SUBLAYERS):
        x, lag = rlag.unpack_lag(state)
        x, pre = rlag.lagged_sublayer(x, lag, f[f"fn{k}"], f[f"base{k}"], f[f"scale{k}"], ITERS, EPS, NORM_EPS,
                                      lambda a, k=k: linear(a, f[f"block{k}"]))
        state = rlag.pack_lag(x, pre)
    x, lag = rlag.unpack_lag(state)
    return state, rlag.last_mix(x, lag)


def test_reference_definitions():
    """The first fold is stream 0; sublayer k+1 folds with sublayer k's pre (by hand with reference.ops.mhc); the
    pack round-trips; LastMix is the fold by the last pre; the lag changes the result (a test that can fail)."""
    f = {k: v.double().numpy() for k, v in weights().items()}
    x = f["x"]
    lag0 = rlag.lag_init(x)
    assert np.array_equal(rmhc.mhc_collapse(x, lag0), x[:, 0])
    x1, pre0 = rlag.lagged_sublayer(x, lag0, f["fn0"], f["base0"], f["scale0"], ITERS, EPS, NORM_EPS,
                                    lambda a: linear(a, f["block0"]))
    w0 = rmhc.mhc_weights(x, f["fn0"], f["base0"], f["scale0"], ITERS, EPS, NORM_EPS)
    assert np.array_equal(pre0, w0.pre)
    assert np.array_equal(x1, rmhc.mhc_expand(linear(x[:, 0], f["block0"]), x, w0.post, w0.comb))
    x2, _ = rlag.lagged_sublayer(x1, pre0, f["fn1"], f["base1"], f["scale1"], ITERS, EPS, NORM_EPS,
                                 lambda a: linear(a, f["block1"]))
    w1 = rmhc.mhc_weights(x1, f["fn1"], f["base1"], f["scale1"], ITERS, EPS, NORM_EPS)
    assert np.array_equal(x2, rmhc.mhc_expand(linear(rmhc.mhc_collapse(x1, pre0), f["block1"]), x1, w1.post,
                                              w1.comb))
    own = rmhc.mhc_expand(linear(rmhc.mhc_collapse(x1, w1.pre), f["block1"]), x1, w1.post, w1.comb)
    assert np.abs(own - x2).max() > 1e-3 * np.abs(x2).max()
    state = rlag.pack_lag(x2, pre0)
    back = rlag.unpack_lag(state)
    assert state.shape == (N, S + 1, H) and np.array_equal(back[0], x2) and np.array_equal(back[1], pre0)
    assert not state[:, S, S:].any()
    assert np.array_equal(rlag.last_mix(x2, pre0), rmhc.mhc_collapse(x2, pre0))
    with pytest.raises(ValueError, match="does not fit"):
        rlag.pack_lag(x[:, :, :2], lag0)


# ---------------------------------------------------------------------------------------------- device vs host

def chain_ops() -> list[Op]:
    mix = [Op("rms over S*H", S * H), Op("fn", S * H), Op("softmax", S)] + [Op("sinkhorn pass", S)] * (2 * ITERS)
    return (mix + [Op("fold", S), Op("block", H), Op("expand", S + 1)]) * SUBLAYERS


def lag_gate(dtype: str, seed: int = 0):
    kw, f = as_dtype(weights(seed), dtype)
    rep = report("mhc_lagged")
    state, head = k_chain(kw)
    ops = chain_ops()
    check(rep, f"mhc_lagged tap after {SUBLAYERS} sublayers [N, S+1, H]", state, lambda: r_chain(f), dtype, ops,
          lambda r: r[0])
    check(rep, "mhc_lagged LastMix collapse [N, H]", head, lambda: r_chain(f), dtype, ops + [Op("fold", S)],
          lambda r: r[1])
    return rep


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_lagged_gate_passes(dtype):
    rep = lag_gate(dtype)
    assert rep.finish() == 0, rep.lines
    assert len([line for line in rep.lines if line.startswith("(r) mhc_lagged ")]) == 2


def test_reference_runs_on_the_strict_device_bit_for_bit():
    f = {k: v.double().numpy() for k, v in weights(1).items()}
    names = sorted(f)

    def compute(*arrays):
        return r_chain(dict(zip(names, arrays, strict=True)))

    args = [f[k] for k in names]
    dev, host = on_fake_device(compute, *args), compute(*args)
    assert np.array_equal(dev[0], host[0]) and np.array_equal(dev[1], host[1])


# ---------------------------------------------------------------------------------------------- FAIL-first (bf16)

def test_fail_first_lagged_mix_applied_unlagged(monkeypatch):
    """Each sublayer folded by its OWN pre (V4's HcMix::Own) instead of the previous sublayer's."""
    def unlagged(x, lag, fn, base, scale, iters, eps, norm_eps, sublayer):
        w = kmhc.mhc_weights(x, fn, base, scale, iters, eps, norm_eps)
        return kmhc.mhc_expand(sublayer(kmhc.mhc_collapse(x, w.pre)), x, w.post, w.comb), w.pre

    monkeypatch.setattr(klag, "lagged_sublayer", unlagged)
    rep = lag_gate("bf16")
    assert rep.finish() == 1
    assert any(line.startswith("(r) mhc_lagged tap") and line.endswith("FAIL") for line in rep.lines), rep.lines


def test_fail_first_last_mix_takes_one_stream(monkeypatch):
    monkeypatch.setattr(klag, "last_mix", lambda x, lag: x[:, 0])
    assert fails_only(lag_gate("bf16"), "(r) mhc_lagged LastMix"), lag_gate("bf16").lines
