"""qwen4exp's PLE hashing inputs as HF derives them from the config (its checkpoint does not store them; a GGUF
does, as ``ple.*``): the formulas of ``reference.ops.ple``'s docstring, in integers, for the engine and the
reference alike (each wraps them in its own array type).

    m_k = 2 (splitmix64(seed + 10007 l + gamma (k+1)) mod floor(floor((2^63-1) / V) / 2)) + 1        k < N
    p_j = the (l (N-1) hpn + j + 1)-th prime above base - 1;  o_j = p_0 + .. + p_{j-1}            j < (N-1) hpn
"""

from __future__ import annotations

import math

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def splitmix64(v: int) -> int:
    """Steele, Lea and Flood's SplitMix64 finaliser on v + gamma (all mod 2^64)."""
    z = (v + GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))


def ngram_tables(vocab: int, ngram: int, heads_per_ngram: int, base: int, layer_index: int,
                 seed: int) -> tuple[list[int], list[int], list[int]]:
    """(multipliers [N], prime head sizes [(N-1) hpn], offsets [(N-1) hpn]) of PLE layer ``layer_index``."""
    half = max(1, ((2 ** 63 - 1) // max(vocab, 1)) // 2)
    start = seed + 10007 * layer_index
    mult = [2 * (splitmix64((start + GAMMA * (k + 1)) & MASK64) % half) + 1 for k in range(ngram)]
    heads = (ngram - 1) * heads_per_ngram
    primes, p = [], base - 1
    while len(primes) < (layer_index + 1) * heads:
        p += 1
        if is_prime(p):
            primes.append(p)
    sizes = primes[layer_index * heads:]
    return mult, sizes, [sum(sizes[:j]) for j in range(len(sizes))]


def spec_tables(ple, vocab: int) -> tuple[list[int], list[int], list[int]]:
    """(multipliers, sizes, offsets) of a ``spec.PLEShape``'s (single) PLE layer: the GGUF's stored ``ple.*`` arrays
    when the spec carries them, else HF's derivation above from the config's base and seed (PLE index 0)."""
    if ple.multipliers:
        return list(ple.multipliers), list(ple.head_vocab_sizes), list(ple.head_offsets)
    return ngram_tables(vocab, ple.ngram_size, ple.heads_per_ngram, ple.vocab_base, 0, ple.seed)
