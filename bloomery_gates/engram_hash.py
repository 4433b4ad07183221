"""DeepSeek V4.1's engram row ids (docs/V41.md 7): the seed engine's formula (``crates/engram/src/hash.rs`` module
doc, ``ngram::rows``), in integers, for the engine and the reference alike. The constants are file data
(``deepseek41.engram.{multipliers, primes, offsets, token_map, pad_id}``), one set per site, none defaulted.

Per site e and the token at position t, with ctx[s] = token_map[id_{t-s}] (pad_id before the sequence start):

    rolling = ctx[0] mult[0]                                                  (u64, wrapping)
    for s in 1 .. n_gram-1:  rolling ^= ctx[s] mult[s]
                             for h < n_heads:  b = (s-1) n_heads + h;  row[b] = rolling mod prime[b] + offset[b]

n_cols = (n_gram - 1) n_heads rows a token, in bucket order b; the offsets are the exclusive prefix sums of the
primes (the buckets tile the table's rows 0 .. sum(primes)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class EngramHash:
    """The engram dimensions and hash constants: ``layer_ids`` (site order), ``n_heads``, ``n_gram``,
    ``key_length``, ``pad``, ``token_map`` [vocab], ``mult`` [sites n_gram], ``prime`` / ``offset``
    [sites n_cols], site-major."""

    layer_ids: tuple[int, ...]
    n_heads: int
    n_gram: int
    key_length: int
    pad: int
    token_map: tuple[int, ...]
    mult: tuple[int, ...]
    prime: tuple[int, ...]
    offset: tuple[int, ...]

    @property
    def n_cols(self) -> int:
        return (self.n_gram - 1) * self.n_heads

    def site(self, layer: int) -> int | None:
        return self.layer_ids.index(layer) if layer in self.layer_ids else None

    def table_rows(self, site: int) -> int:
        c = self.n_cols
        return sum(self.prime[site * c:(site + 1) * c])

    def rows(self, site: int, ids: Sequence[int], start: int = 0) -> list[list[int]]:
        """The n_cols row ids of each position start.. of the sequence ``ids`` (positions 0..len-1)."""
        c, g = self.n_cols, self.n_gram
        mult, prime, offset = self.mult[site * g:(site + 1) * g], self.prime[site * c:(site + 1) * c], \
            self.offset[site * c:(site + 1) * c]
        out = []
        for t in range(start, len(ids)):
            ctx = [self.token_map[ids[t - s]] if t - s >= 0 else self.pad for s in range(g)]
            rolling = (ctx[0] * mult[0]) & MASK64
            row = [0] * c
            for s in range(1, g):
                rolling ^= (ctx[s] * mult[s]) & MASK64
                for h in range(self.n_heads):
                    b = (s - 1) * self.n_heads + h
                    row[b] = rolling % prime[b] + offset[b]
            out.append(row)
        return out
