"""Derived reference bands (CONTRACT.md, tier 2): how far a kernel tap may sit from the f64 reference.

Model. A tapped stage is reached through a chain of k ops. Op i does one reduction of length n_i
accumulated in float32 (torch accumulates bf16/f16 matmuls in f32), then rounds its output once to
the storage dtype. Standard first-order forward error analysis (Higham, ch. 3) gives op i a
relative error of at most u_store + gamma(n_i, u_acc), gamma(n, u) = n u / (1 - n u), and errors of
chained ops add to first order. The band on the metric ``worst_rel`` is

    band = kappa * sum_i ( u_store + gamma(n_i, u_acc) ),     u_acc = 2^-24

kappa = KAPPA = 8 is a stated conditioning constant, not a fitted one. The per-op bound is relative
to sum|w x| (a well-conditioned dot product); two ops amplify beyond that to first order: RMSNorm
(divides by a computed rms and multiplies by gains w, which can lift small channels) and softmax
(an absolute score error e becomes a relative weight error of about e, and a score of size |s|
carries |s| times its relative error). kappa = 8 covers gains and score magnitudes of order a few.
It is fixed here from op counts and dtypes alone: a band never depends on a measured error, and
is never relaxed to make a gate pass.

That worst-case chain is a ceiling, not a band: in bf16 it allows 0.41 per layer where a correct
kernel errs by 0.005, so it cannot see a wrong epsilon or a swapped norm. The gates' (r) lines use
the emulated band instead (``emulated_band``), a model of the TYPICAL error:

    e_emu  = the float64 reference run again with every stored op's output and every weight rounded
             to the run's dtype (``reference.rounding``: ml_dtypes' real bfloat16), on the same inputs;
             its deviation from the exact reference is one draw of the storage-rounding error that an
             engine of that dtype makes here (same ops, same rounding points, same weights);
    e_acc  = sum over the chained ops of sqrt(n_i) u_acc: float32 accumulation, which the emulation
             does not round, at its probabilistic size (Higham and Mary 2019: the error of an n-term
             sum is sqrt(n) u to first order with high probability, against n u in the worst case);
    band   = M_WORST (worst_rel(e_emu) + e_acc)   on worst_rel,
    rms    = M_RMS   (rel_rms(e_emu)   + e_acc)   on rel_rms = ||got - ref||_F / ||ref||_F.

The engine's error and the emulation's are draws of the same distribution (the same rounding count
at the same points; only the order of float32 sums differs), so their worst-case statistics agree
within a factor of about 1.5 over the thousands of entries of a tap, and their RMS closer still.
M_WORST = 3 and M_RMS = 2 are stated multiples of that agreement (twice it, and more), fixed here; on
CPU the emulation reproduces torch's bf16 rounding almost bit for bit (kernel / emulated = 1.00). The RMS statistic
catches what the worst entry hides: a systematic shift (a wrong epsilon, a wrong gain) moves every
entry a little, far above the RMS of rounding noise and below its worst entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from bloomery_gates.dtypes import ALL
from bloomery_gates.spec import LayerShape

KAPPA = 8.0
M_WORST = 3.0     # emulated band: multiple of the emulated run's worst_rel
M_RMS = 2.0       # emulated band: multiple of the emulated run's rel_rms
ALPHA = 1e-3      # small taps: the false-alarm rate of one (r) line whose statistic is a draw over few entries
SMALL_N = 64      # below this many entries the sampling quantile can exceed M_RMS / M_WORST (see small_tap)
U_ACC = 2.0**-24  # float32 accumulation
_UNIT_ROUNDOFF = {k: d.unit_roundoff for k, d in ALL.items()}          # bloomery_gates.dtypes
_ALIASES = {"float32": "f32", "float": "f32", "bfloat16": "bf16", "float16": "f16", "half": "f16",
            "float64": "f64", "double": "f64"}


@dataclass(frozen=True)
class Band:
    """An allowed ``worst_rel`` and the sentence that derives it."""

    value: float
    derivation: str
    rms: float | None = None        # the allowed rel_rms, where the band checks it

    def contains(self, rel: float, rms: float | None = None) -> bool:
        return bool(rel <= self.value and (self.rms is None or rms is None or rms <= self.rms))


@dataclass(frozen=True)
class Op:
    """One op of a chain: a reduction of length n (n = 1 for an elementwise op), output rounded once."""

    name: str
    n: int


def unit_roundoff(dtype: object) -> float:
    """u of a storage dtype: f32 2^-24, bf16 2^-8, f16 2^-11 (f64 2^-53). Accepts 'bf16',
    'bfloat16', torch.bfloat16, ..."""
    key = str(dtype).removeprefix("torch.").lower()
    key = _ALIASES.get(key, key)
    if key not in _UNIT_ROUNDOFF:
        raise ValueError(f"no unit roundoff for dtype {dtype!r}; expected one of f32, bf16, f16, f64")
    return _UNIT_ROUNDOFF[key]


def gamma(n: int, u: float) -> float:
    """gamma(n, u) = n u / (1 - n u): the relative error bound of an n-term sum with roundoff u."""
    if n < 0 or n * u >= 1.0:
        raise ValueError(f"gamma undefined for n={n}, u={u} (needs 0 <= n u < 1)")
    return n * u / (1.0 - n * u)


def chain_band(dtype: object, ops: Sequence[Op], what: str, kappa: float = KAPPA) -> Band:
    """kappa * sum over ops of (u_store + gamma(n_i, u_acc)), with its derivation spelled out."""
    u = unit_roundoff(dtype)
    u_acc = min(U_ACC, u)   # accumulation is float32, or float64 when the data are float64
    value = kappa * sum(u + gamma(op.n, u_acc) for op in ops)
    lengths = sorted({op.n for op in ops})
    derivation = (f"{what}: kappa={kappa:g} * sum over {len(ops)} chained ops of "
                  f"(u_store={u:.3g} [{dtype}] + gamma(n, u_acc={u_acc:.3g})), "
                  f"reduction lengths n in {lengths}")
    return Band(value=value, derivation=derivation)


def layer_ops(shape: LayerShape, seq_len: int) -> list[Op]:
    """The chained stored ops of one Qwen3-style layer, in order (q/k/v run side by side: one op)."""
    h, d, nh, i = shape.hidden_size, shape.head_dim, shape.num_heads, shape.intermediate_size
    return [
        Op("input_layernorm", h),
        Op("q/k/v proj", h),
        Op("q/k norm", d),
        Op("rope", 2),
        Op("scores q.k", d),
        Op("softmax + AV", seq_len),
        Op("o proj", nh * d),
        Op("residual add", 1),
        Op("post_attention_layernorm", h),
        Op("gate/up proj", h),
        Op("silu(gate) * up", 1),
        Op("down proj", i),
        Op("residual add", 1),
    ]


def layer_band(dtype: object, shape: LayerShape, layers: int, seq_len: int) -> Band:
    """Band for the output of the ``layers``-th layer (hidden[layers]; 1 = the first layer's output).

    seq_len: the longest row of attention in the run (context + rows), the softmax + AV length.
    """
    if layers < 0 or seq_len < 1:
        raise ValueError(f"layers={layers}, seq_len={seq_len}: need layers >= 0, seq_len >= 1")
    ops = layer_ops(shape, seq_len) * layers
    return chain_band(dtype, ops, f"hidden after {layers} layer(s), seq_len {seq_len}")


def logits_band(dtype: object, shape: LayerShape, layers: int, seq_len: int) -> Band:
    """Band for logits: ``layers`` layers, then the final norm (n = H) and the head (n = H)."""
    if layers < 0 or seq_len < 1:
        raise ValueError(f"layers={layers}, seq_len={seq_len}: need layers >= 0, seq_len >= 1")
    h = shape.hidden_size
    ops = layer_ops(shape, seq_len) * layers + [Op("final norm", h), Op("lm head", h)]
    return chain_band(dtype, ops, f"logits after {layers} layer(s), seq_len {seq_len}")


def _pair(got: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray, float | None]:
    """Both as float64 of one shape, and the statistic's value where it is decided already: 0.0 for empty
    arrays, inf for a NaN/inf in ``got``; else None."""
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if g.shape != r.shape:
        raise ValueError(f"shape mismatch: got {g.shape}, ref {r.shape}")
    if g.size == 0:
        return g, r, 0.0
    return g, r, (None if np.isfinite(g).all() else float("inf"))


def worst_rel(got: np.ndarray, ref: np.ndarray) -> float:
    """max over rows of max|got_row - ref_row| / max|ref_row| (a row = the last axis).

    Both are taken to float64. A row whose reference is all zero counts its absolute error.
    Any NaN/inf in ``got`` gives inf.
    """
    g, r, early = _pair(got, ref)
    if early is not None:
        return early
    err = np.max(np.abs(g - r), axis=-1)
    scale = np.max(np.abs(r), axis=-1)
    return float(np.max(err / np.where(scale > 0, scale, 1.0)))


def flip_excused(ref_row: np.ndarray, band: Band) -> bool:
    """A greedy flip is excused when the reference's top-2 margin is inside the band.

    Every logit may move by band * max|ref_row|, so top-1 and top-2 can swap only if
    (top1 - top2) <= 2 * band * max|ref_row|.
    """
    r = np.asarray(ref_row, dtype=np.float64)
    top2 = np.sort(r)[-2:]
    return bool(top2[1] - top2[0] <= 2.0 * band.value * np.max(np.abs(r)))


def routing_flip_excused(choice_row: np.ndarray, own_row: np.ndarray, got_row: np.ndarray, band: Band,
                         rule: Callable[[np.ndarray], np.ndarray] | None = None) -> bool:
    """A routing flip is excused when it lies inside the band of the reference's choice scores c [E].

    The kernel chose the experts got_row, the reference own_row (k each); each score may move by
    eps = band * max|c|, max|c| over the finite scores (-inf: an entry the row does not see or a mask left out;
    +inf: one always kept). A plain top-k (``rule`` None): every expert b only the kernel chose outranked, on the
    kernel's scores, every expert a only the reference chose, possible only if max_a c_a - min_b c_b <= 2 * eps
    (for k = 1 the greedy rule's top-2 margin). A choice with a rule of its own (``rule``: c [1, E] -> ids [1, k],
    e.g. a group-limited router, whose flip may sit in the group decision): excused when the rule picks the
    kernel's set on c moved by eps towards it (+eps on the kernel's experts, -eps on all others). Equal sets are
    no flip (True); a kernel row that repeats an expert, or a flip to or from a non-finite score (no rounding moves
    an entry across infinity), is never excused; -1 (an empty slot of a choice over fewer visible entries than k)
    is no entry.
    """
    c = np.asarray(choice_row, dtype=np.float64)
    got_ids = [int(e) for e in got_row if e >= 0]
    own, got = {int(e) for e in own_row if e >= 0}, set(got_ids)
    extra, displaced = sorted(got - own), sorted(own - got)
    if len(got) != len(got_ids) or len(extra) != len(displaced):
        return False
    if not extra:
        return True
    finite = c[np.isfinite(c)]
    if not (np.isfinite(c[extra]).all() and np.isfinite(c[displaced]).all()) or not finite.size:
        return False
    eps = band.value * np.max(np.abs(finite))
    if rule is None:
        return bool(c[displaced].max() - c[extra].min() <= 2.0 * eps)
    toward = np.where(np.isin(np.arange(c.size), got_ids), c + eps, c - eps)
    return {int(e) for e in np.asarray(rule(np.where(np.isfinite(c), toward, c)[None]))[0] if e >= 0} == got


def rel_rms(got: np.ndarray, ref: np.ndarray) -> float:
    """||got - ref||_F / ||ref||_F over the whole array, in float64 (inf on NaN/inf in ``got``)."""
    g, r, early = _pair(got, ref)
    if early is not None:
        return early
    scale = float(np.linalg.norm(r))
    return float(np.linalg.norm(g - r)) / (scale if scale > 0 else 1.0)


def accumulation_term(dtype: object, ops: Sequence[Op]) -> float:
    """e_acc = sum_i sqrt(n_i) u_acc: float32 (or float64) accumulation at its probabilistic size."""
    u_acc = min(U_ACC, unit_roundoff(dtype))
    return float(sum(np.sqrt(op.n) for op in ops) * u_acc)


@cache
def small_tap(n: int) -> tuple[float, float]:
    """(worst, rms) multipliers for a tap of n entries: max(M, q_{1-ALPHA}(n)) for each statistic.

    The multiples M_WORST and M_RMS rest on the engine's and the emulation's statistics being two draws
    that agree closely because each pools thousands of entries. A tap of a few entries (DSpark's [B]
    confidence logits) pools too few: under the null hypothesis that engine and emulation make errors
    of one distribution, the ratio of their statistics over n i.i.d. N(0, s^2) entries is
    sqrt(F(n, n)) for rel_rms and max|a| / max|b| for worst_rel, whose 1 - ALPHA quantile q(n) is 3.9
    and 4.3 at n = 7 (F(7, 7) at 0.999 is 15.0), where M = 2 and 3 would make such a line a 5% / 1% test
    that a correct kernel fails. The band's multiple is therefore max(M, q(n)), q estimated from 200000
    seeded draws of each ratio (deterministic). q falls with n and q(SMALL_N = 64) is 1.5 and 2.0, under
    both M (tests/test_emulated_bands.py checks it), so every tap of SMALL_N entries or more keeps M.
    The correction follows from n alone, never from a measured error.
    """
    if n >= SMALL_N:
        return M_WORST, M_RMS
    qw, qr = ratio_quantiles(n)
    return max(M_WORST, qw), max(M_RMS, qr)


def ratio_quantiles(n: int, draws: int = 200_000) -> tuple[float, float]:
    """The 1 - ALPHA quantiles of max|a| / max|b| and sqrt(sum a^2 / sum b^2), a, b [n] i.i.d. N(0, 1)."""
    rng = np.random.default_rng(20261201)
    a, b = rng.standard_normal((2, draws, max(n, 1)))
    worst = np.abs(a).max(-1) / np.abs(b).max(-1)
    rms = np.sqrt((a * a).sum(-1) / (b * b).sum(-1))
    return float(np.quantile(worst, 1.0 - ALPHA)), float(np.quantile(rms, 1.0 - ALPHA))


def emulated_band(dtype: object, exact: np.ndarray, emulated: np.ndarray, what: str,
                  ops: Sequence[Op] = ()) -> Band:
    """The (r) band of a tap: M_WORST (worst_rel(emulated, exact) + e_acc), and M_RMS (rel_rms + e_acc);
    for a tap of fewer than SMALL_N entries the multiples are ``small_tap(n)``'s.

    ``exact``: the f64 reference of the tap; ``emulated``: the same reference computation run inside
    ``reference.rounding.stored_as(dtype)`` on the same inputs; ``ops``: the chained ops behind the tap
    (their reduction lengths give e_acc). See the module docstring for the derivation.
    """
    acc = accumulation_term(dtype, ops)
    w, r = worst_rel(emulated, exact), rel_rms(emulated, exact)
    mw, mr = small_tap(int(np.size(exact)))
    value, rms = mw * (w + acc), mr * (r + acc)
    small = f"; {np.size(exact)} entries: multiples from small_tap" if (mw, mr) != (M_WORST, M_RMS) else ""
    derivation = (f"{what}: {mw:.3g} x (emulated {dtype} worst_rel {w:.3g} + e_acc {acc:.3g}); "
                  f"{mr:.3g} x (emulated rel_rms {r:.3g} + e_acc); e_acc over {len(ops)} ops{small}")
    return Band(value=value, derivation=derivation, rms=rms)
