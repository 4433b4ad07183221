"""MXFP4 expert weights (OCP Microscaling Formats v1.0, "MXFP4"; DeepSeek V4's native FP4 routed experts, which
llama.cpp's converter repacks losslessly to GGML MXFP4: docs/FAMILIES_MOE.md section 4.4 "Quant in practice"), in
float64. A weight matrix W [R, K] (K a multiple of 32) is held as

    codes  [R, K/2] uint8    two e2m1 codes a byte: element 2j in the LOW nibble, element 2j+1 in the HIGH nibble
                             (the OCP / torch ``float4_e2m1fn_x2`` order, DeepSeek's and gpt-oss' checkpoints)
    scales [R, K/32] uint8   one e8m0 scale per block of 32 consecutive elements of a row

    e2m1 code c = s eee m (4 bits): value (-1)^s * E2M1[c & 7], E2M1 = (0, 0.5, 1, 1.5, 2, 3, 4, 6)
    e8m0 byte e: 2^(e - 127) (no sign, no mantissa); e = 255 is NaN
    W[r, k] = E2M1(code[r, k]) * 2^(scales[r, k // 32] - 127)

GGML's ``block_mxfp4`` (the GGUF type MXFP4) holds the same numbers with another nibble order: a block is 17 bytes
(e, qs[16]) and qs[j] carries element j in its low nibble and element j + 16 in its high nibble (``from_ggml`` /
``to_ggml`` convert, byte for byte; gguf-py's MXFP4 is the oracle, tests/test_ops_mxfp4.py).

Everything here is exact: every MXFP4 value is a dyadic rational with a 2-bit significand, so ``dequantize`` in
float64 is the number the format means, and the routed experts run the ordinary float64 reference
(``reference.ops.swiglu_clamp`` / ``reference.ops.moe``) on those values: the bands of a gate do not move when its
experts are stored in 4 bits. The device keeps them in 4 bits (``kernels.ops.mxfp4``).

Memory, for the plan: a weight costs 4 bits plus its share of an 8-bit scale per 32, i.e. 4.25 bits:

    mxfp4_bytes(n) = n / 2 + n / 32        (n a multiple of 32)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..xp import common, ns
from .moe import Routing
from .moe import routed_experts as routed_plain
from .swiglu_clamp import routed_experts_clamped

BLOCK = 32
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
E2M1_EMAX = 2                     # the largest e2m1 magnitude is 6 = 1.5 * 2^2
E8M0_BIAS, E8M0_NAN = 127, 255


@dataclass
class Mxfp4:
    """A packed weight: codes [..., R, K/2] uint8, scales [..., R, K/32] uint8 (module docstring)."""

    codes: np.ndarray
    scales: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the weight it stands for: [..., R, K]."""
        return (*self.codes.shape[:-1], 2 * self.codes.shape[-1])

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scales.nbytes)


def mxfp4_bytes(n_weights: int) -> int:
    """Bytes that n weights take in MXFP4: n/2 (4-bit codes) + n/32 (one e8m0 byte a block) = 4.25 bits a weight."""
    if n_weights < 0 or n_weights % BLOCK:
        raise ValueError(f"MXFP4 holds whole blocks of {BLOCK} weights, not {n_weights}")
    return n_weights // 2 + n_weights // BLOCK


def e8m0(scales: np.ndarray) -> np.ndarray:
    """e8m0 bytes [...] -> 2^(e - 127) in float64 (exact), NaN for 255."""
    xp = ns(scales)
    e = scales.astype(np.int64)
    return xp.where(e == E8M0_NAN, np.nan, xp.ldexp(xp.ones(e.shape), (e - E8M0_BIAS).astype(np.int32)))


def unpack_codes(codes: np.ndarray) -> np.ndarray:
    """codes [..., K/2] uint8 -> e2m1 codes [..., K] uint8: element 2j = low nibble of byte j, 2j+1 = high nibble."""
    out = ns(codes).empty((*codes.shape[:-1], 2 * codes.shape[-1]), dtype=np.uint8)
    out[..., 0::2] = codes & 0x0F
    out[..., 1::2] = codes >> 4
    return out


def pack_codes(nibbles: np.ndarray) -> np.ndarray:
    """The inverse of ``unpack_codes``: [..., K] codes (0..15) -> [..., K/2] uint8."""
    n = nibbles.astype(np.uint8)
    return (n[..., 0::2] | (n[..., 1::2] << 4)).astype(np.uint8)


def dequantize(w: Mxfp4) -> np.ndarray:
    """The exact float64 values: [..., R, K] = E2M1[code] * 2^(e - 127), e the block's scale (module docstring)."""
    vals = ns(w.codes).asarray(E2M1)[unpack_codes(w.codes)]
    shape = vals.shape
    blocks = vals.reshape(*shape[:-1], shape[-1] // BLOCK, BLOCK)
    return (blocks * e8m0(w.scales)[..., None]).reshape(shape)


def quantize(w: np.ndarray) -> Mxfp4:
    """A float weight [..., R, K] -> MXFP4 (for fixtures and tests; not the format's only rounding). Per block of 32:

        amax = max |w|;  e = clip(floor(log2 amax) - 2 + 127, 0, 254)   (e = 0 for an all-zero block)
        code = the e2m1 value nearest to w / 2^(e - 127) (saturating at +-6; ties to the smaller magnitude)

    floor(log2 amax) is taken with frexp (exact). ``kernels.ops.mxfp4.quantize`` gives the same bytes."""
    w = np.asarray(w, dtype=np.float64)
    if w.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 rows must be a multiple of {BLOCK} long, not {w.shape[-1]}")
    blocks = w.reshape(*w.shape[:-1], w.shape[-1] // BLOCK, BLOCK)
    amax = np.abs(blocks).max(axis=-1)
    _, p = np.frexp(amax)                               # amax = m 2^p, m in [0.5, 1): floor(log2 amax) = p - 1
    e = np.where(amax > 0, np.clip(p - 1 - E2M1_EMAX + E8M0_BIAS, 0, 254), 0).astype(np.uint8)
    q = blocks / e8m0(e)[..., None]
    mags = E2M1[:8]
    mag_code = np.abs(np.abs(q)[..., None] - mags).argmin(axis=-1)       # first (smaller) magnitude on a tie
    code = (mag_code | np.where(np.signbit(q), 8, 0)).astype(np.uint8).reshape(w.shape)
    return Mxfp4(pack_codes(code), e)


def from_ggml(blocks: np.ndarray, k: int) -> Mxfp4:
    """GGML MXFP4 bytes [..., R, K/32 * 17] (per block: e, then qs[16] with element j low, j + 16 high) -> Mxfp4."""
    b = blocks.reshape(*blocks.shape[:-1], k // BLOCK, 17)
    qs = b[..., 1:]
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)             # [..., K/32, 32] in element order
    return Mxfp4(pack_codes(nib.reshape(*blocks.shape[:-1], k)), np.ascontiguousarray(b[..., 0]))


def to_ggml(w: Mxfp4) -> np.ndarray:
    """The inverse of ``from_ggml``: Mxfp4 -> GGML MXFP4 bytes [..., R, K/32 * 17]."""
    nib = unpack_codes(w.codes)
    nb = nib.reshape(*nib.shape[:-1], nib.shape[-1] // BLOCK, BLOCK)
    qs = (nb[..., :16] | (nb[..., 16:] << 4)).astype(np.uint8)
    out = np.concatenate([w.scales[..., None], qs], axis=-1)
    return out.reshape(*nib.shape[:-1], -1)


def routed_experts_mxfp4(x: np.ndarray, routing: Routing, gate_up: Mxfp4, down: Mxfp4,
                         limit: float | None) -> np.ndarray:
    """The routed experts on the exact dequantised weights: x [T, H], gate_up [E, 2I, H], down [E, H, I] (MXFP4)
    -> [T, H]; SwiGLU clamped at ``limit`` (DeepSeek V4's swiglu_limit, ``reference.ops.swiglu_clamp``) or plain
    (``reference.ops.moe``) when None. Only the chosen experts are dequantised (the rest are never read)."""
    xp, ids = common(routing.ids)
    chosen = xp.unique(ids)
    gu, dn = xp.zeros(gate_up.shape), xp.zeros(down.shape)
    gu[chosen] = dequantize(Mxfp4(gate_up.codes[chosen], gate_up.scales[chosen]))
    dn[chosen] = dequantize(Mxfp4(down.codes[chosen], down.scales[chosen]))
    if limit is None:
        return routed_plain(x, routing, gu, dn)
    return routed_experts_clamped(x, routing, gu, dn, limit)
