"""MXFP4 expert weights kept in 4 bits on the device (torch, CPU or CUDA); the format, its exact values and the
byte count are in ``reference.ops.mxfp4`` (name for name). A weight W [..., R, K] lives as

    codes  [..., R, K/2] uint8   e2m1 pairs, element 2j in the low nibble, 2j+1 in the high nibble (OCP order)
    scales [..., R, K/32] uint8  e8m0, 2^(e - 127)

so a routed-expert tensor takes 4.25 bits a weight on the device (``mxfp4_bytes``), about a quarter of bf16.

The routed experts gather and dequantise inside the matmul: the (row, slot) pairs go in chunks as in
``kernels.ops.moe.routed_experts``; for a chunk of P pairs only the chosen experts' tiles are gathered from the
packed tensors (codes[ids] [P, 2I, H/2], scales[ids]) and decoded to the run dtype ([P, 2I, H], [P, H, I]) right
before the batched product, then dropped. The whole expert tensor is never widened: at most ``budget`` bytes of
decoded tiles exist at a time (at least one pair; ``MXFP4_BUDGET``, 64 MiB, unless given: a quarter of the float
experts' ``GATHER_BUDGET``, so the transient stays small beside 4-bit weights), and the decode itself holds an
int32 byte index beside its tile (``dequantize``: (2 + e) bytes a weight at its peak), which ``plan`` counts.

What is exact and what is emulated: the decode is exact in bf16 and f32 (an e2m1 value has a 2-bit significand and
the scale is a power of two; bf16 and f32 share f32's exponent range, so every finite MXFP4 value with
e <= 252 is representable: e2m1 6 * 2^125 < f32 max) and e8m0 255 decodes to NaN, as the format says. f16 is not
exact (its range is far smaller) and is refused. The products after the decode are the run dtype's ordinary matmuls
(float32 accumulation), so the kernel matches the float64 reference on the same exact values within the same
emulated bands as the unquantised experts (``kernels.ops.swiglu_clamp.routed_experts_clamped``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .moe import Routing
from .swiglu_clamp import clamp_act

T = torch.Tensor
BLOCK = 32
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E2M1_EMAX, E8M0_BIAS, E8M0_NAN = 2, 127, 255
EXACT_DTYPES = (torch.bfloat16, torch.float32)
MXFP4_BUDGET = 1 << 26            # bytes of decoded expert tiles per chunk (at least one pair per chunk)


@dataclass
class Mxfp4:
    """A packed weight on the device: codes [..., R, K/2] uint8, scales [..., R, K/32] uint8."""

    codes: T
    scales: T

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.codes.shape[:-1], 2 * self.codes.shape[-1])

    @property
    def nbytes(self) -> int:
        """Resident bytes, measured on the tensors themselves."""
        return self.codes.nbytes + self.scales.nbytes

    def to(self, device: torch.device | str) -> Mxfp4:
        return Mxfp4(self.codes.to(device), self.scales.to(device))


def mxfp4_bytes(n_weights: int) -> int:
    """n/2 + n/32 bytes for n weights (4.25 bits a weight; n a multiple of 32): what ``plan`` counts."""
    if n_weights < 0 or n_weights % BLOCK:
        raise ValueError(f"MXFP4 holds whole blocks of {BLOCK} weights, not {n_weights}")
    return n_weights // 2 + n_weights // BLOCK


def e8m0(scales: T) -> T:
    """e8m0 bytes [...] -> 2^(e - 127) as float32, built from the bits (exact; e = 0 is the subnormal 2^-127)."""
    e = scales.to(torch.int32)
    bits = torch.where(e == 0, torch.full_like(e, 0x00400000), e << 23)
    val = bits.view(torch.float32)
    return torch.where(e == E8M0_NAN, torch.full_like(val, float("nan")), val)


def unpack_codes(codes: T) -> T:
    """codes [..., K/2] uint8 -> [..., K] e2m1 codes: element 2j = low nibble, 2j+1 = high nibble."""
    return torch.stack([codes & 0x0F, codes >> 4], dim=-1).flatten(-2)


def pack_codes(nibbles: T) -> T:
    """[..., K] codes (0..15) -> [..., K/2] uint8, the inverse of ``unpack_codes``."""
    n = nibbles.to(torch.uint8)
    return n[..., 0::2] | (n[..., 1::2] << 4)


def pair_table(dtype: torch.dtype, device: torch.device | str) -> T:
    """[256, 2] in ``dtype``: the two e2m1 values every code byte holds, in ``unpack_codes``' order (exact)."""
    lut = torch.tensor(E2M1, dtype=torch.float32, device=device)
    return lut[unpack_codes(torch.arange(256, dtype=torch.uint8, device=device)[:, None]).long()].to(dtype)


def decode(index: T, scales: T, dtype: torch.dtype) -> T:
    """index [..., R, K/2] int32 (the code bytes), scales [..., R, K/32] uint8 -> [..., R, K] in ``dtype``: each byte
    picks its two values from ``pair_table``, then the block scales multiply in place (a power of two times a 2-bit
    significand: exact). The index is the caller's to drop: a decode holds (2 + e) bytes a weight at its peak
    (the int32 index and the tile), e the run dtype's size, and the result e bytes a weight: the lookup is an
    ``index_select`` on the int32 index, never advanced indexing (which widens the index to int64 inside the
    op, 4 more bytes a weight that no op output shows)."""
    if dtype not in EXACT_DTYPES:
        raise ValueError(f"MXFP4 decodes exactly to bf16 or f32 only, not {dtype}")
    shape = (*index.shape[:-1], 2 * index.shape[-1])
    # index_select takes the int32 index as it is; ``table[index]`` (aten.index) would first copy it to int64
    # inside the kernel (8 bytes a code byte, 4 a weight: issue 26's 88 MB on the H200, unseen by plan)
    vals = torch.index_select(pair_table(dtype, index.device), 0, index.reshape(-1))     # [n/2, 2]
    del index
    blocks = vals.view(*shape[:-1], shape[-1] // BLOCK, BLOCK)
    blocks.mul_(e8m0(scales).to(dtype)[..., None])
    return vals.view(shape)


def dequantize(w: Mxfp4, dtype: torch.dtype) -> T:
    """[..., R, K] in ``dtype`` (bf16 or f32, both exact: module docstring), decoded straight into ``dtype``."""
    return decode(w.codes.int(), w.scales, dtype)


def quantize(w: T) -> Mxfp4:
    """A float weight [..., R, K] -> MXFP4, the same bytes as ``reference.ops.mxfp4.quantize`` (its docstring)."""
    if w.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 rows must be a multiple of {BLOCK} long, not {w.shape[-1]}")
    w = w.double()
    blocks = w.view(*w.shape[:-1], w.shape[-1] // BLOCK, BLOCK)
    amax = blocks.abs().amax(-1)
    p = torch.frexp(amax).exponent.long()
    e = torch.where(amax > 0, (p - 1 - E2M1_EMAX + E8M0_BIAS).clamp(0, 254), torch.zeros_like(p))
    q = blocks / torch.ldexp(torch.ones_like(amax), e - E8M0_BIAS)[..., None]
    mags = torch.tensor(E2M1[:8], dtype=torch.float64, device=w.device)
    mag_code = (q.abs()[..., None] - mags).abs().argmin(-1)
    code = (mag_code | torch.where(torch.signbit(q), 8, 0)).view(w.shape)
    return Mxfp4(pack_codes(code), e.to(torch.uint8))


def gathered(w: Mxfp4, ids: T, dtype: torch.dtype) -> T:
    """The chosen experts' tiles only: ids [P] -> [P, R, K] in ``dtype`` (w: [E, R, K] packed); the gathered code
    bytes live only until their int32 index is made (``decode``: (2 + e) bytes a weight at the peak)."""
    return decode(w.codes[ids].int(), w.scales[ids], dtype)


def routed_experts_mxfp4(x: T, routing: Routing, gate_up: Mxfp4, down: Mxfp4, limit: float | None,
                         budget: int = MXFP4_BUDGET) -> T:
    """x [N, H], gate_up [E, 2I, H], down [E, H, I] packed -> [N, H] in x's dtype (module docstring); SwiGLU clamped
    at ``limit`` (``kernels.ops.swiglu_clamp.clamp_act``) or plain when None. The weighted sum in float32."""
    n, k = routing.ids.shape
    i = down.shape[-1]
    flat_ids = routing.ids.reshape(-1)
    rows = torch.arange(n, device=x.device).repeat_interleave(k)
    per_pair = (gate_up.shape[-2] * gate_up.shape[-1] + down.shape[-2] * down.shape[-1]) * x.element_size()
    chunk = max(1, budget // per_pair)
    ys = []
    for s in range(0, n * k, chunk):
        e, xr = flat_ids[s:s + chunk], x[rows[s:s + chunk]]
        gu = torch.bmm(gathered(gate_up, e, x.dtype), xr[:, :, None])[..., 0]                  # [P, 2I]
        g, u = gu[:, :i], gu[:, i:]
        a = torch.nn.functional.silu(g) * u if limit is None else clamp_act(g, u, limit)
        ys.append(torch.bmm(gathered(down, e, x.dtype), a[:, :, None])[..., 0])               # [P, H]
    y = torch.cat(ys).view(n, k, -1).float()
    return (routing.weights.float()[..., None] * y).sum(1).to(x.dtype)
