"""The KV store of a chained draft (MTP / NextN, EAGLE-3): one decoder layer that drafts K ids a window, each
chained row reading the row before's own output, over its own KV store indexed by RoPE position.

    store   k, v [1, nkv, cap, d]; slot j = row j (slot 0 holds no row)
    real    a row whose token the target emitted and whose hidden the target computed: written for good
    chained a row whose hidden is the draft's own output: written at the slots after the last real row and
            overwritten by the next pass (that is the rollback)

``accept`` only queues the kept rows' real inputs (``queue``); ``propose`` writes the queue and the anchor's
row in one pass (``real_rows`` / ``written``), so after a verify the kept positions' entries are rewritten from
the target's rows and every entry made from the draft's own output is discarded. A window the loop runs plain
(no ``propose``) still ``accept``s: its rows queue up. The layer math stays in each draft's module.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..ops.attention import attend

T = torch.Tensor


class ChainStore:
    """Store and queue of real rows shared by the chained drafts; subclasses own the layer and the head."""

    def init_store(self, num_kv_heads: int, head_dim: int, cap: int, device: torch.device, dtype: torch.dtype,
                   what: str) -> None:
        self.cap, self.store_what = cap, what
        kv = (1, num_kv_heads, cap, head_dim)
        self.k = torch.zeros(kv, device=device, dtype=dtype)
        self.v = torch.zeros(kv, device=device, dtype=dtype)
        self.key_pos = torch.arange(cap, device=device)
        self.next_slot = 1                  # first slot not yet holding a real row
        self.pend_e = self.pend_h = self.last_h = None   # real rows not yet written; the anchor row's hidden
        self.anchor_written = False

    def attend_at(self, slot0: int, r: int) -> Callable[[T, T, T], T]:
        """``attend_kv`` for R rows at slots slot0..slot0+R-1: writes their k, v, then attends causally over the
        store (slot 0 excluded)."""
        if slot0 + r > self.cap:
            raise ValueError(f"{self.store_what} KV store of {self.cap} positions is full (pass ends at {slot0 + r})")
        pos = torch.arange(slot0, slot0 + r, device=self.key_pos.device)
        allowed = (self.key_pos[None, :] <= pos[:, None]) & (self.key_pos[None, :] >= 1)

        def cached(q: T, k: T, v: T) -> T:
            self.k[:, :, slot0:slot0 + r] = k
            self.v[:, :, slot0:slot0 + r] = v
            return attend(q, self.k, self.v, allowed)

        return cached

    def start(self, e: T, h: T) -> None:
        """The prompt: rows 1..P-1 (token j = e[j-1], hidden j-1 = h[j-1]) are real; hidden P-1 waits for the
        anchor. e [P-1, H] (the prompt's embeddings from row 1), h [P, H]."""
        self.pend_e, self.pend_h, self.last_h = e, h[:-1], h[-1:]
        self.next_slot, self.anchor_written = 1, False

    def queue(self, kept: int, e: T, h: T) -> None:
        """A verify [x, d_1, ...] kept ``kept`` rows (e: its embedding rows, h: its hidden rows): rows (x, h_prev)
        (unless ``propose`` already wrote it) and (d_j, h of verify row j-1) for j < kept join the queue."""
        first = 1 if self.anchor_written else 0
        e, hh = e[first:kept], torch.cat([self.last_h, h[:kept - 1]])[first:]
        self.pend_e, self.pend_h = torch.cat([self.pend_e, e]), torch.cat([self.pend_h, hh])
        self.last_h, self.anchor_written = h[kept - 1:kept], False

    def real_rows(self, anchor_e: T) -> tuple[T, T]:
        """(e, h) of the queued real rows and the anchor's row [R, H], to be written at ``next_slot``."""
        return torch.cat([self.pend_e, anchor_e[None]]), torch.cat([self.pend_h, self.last_h])

    def written(self, rows: int) -> None:
        """The queue and the anchor's row are in the store for good."""
        self.next_slot += rows
        self.anchor_written = True
        self.pend_e, self.pend_h = self.pend_e[:0], self.pend_h[:0]

    def store_rows(self) -> tuple[T, T]:
        """Read-only views (never write through them) of the store's real rows, slots 1..next_slot-1 (chained
        rows past them are transient): (k as stored, v), each [nkv, next_slot-1, d]. After a ``propose`` they
        reach the anchor's slot."""
        return self.k[0, :, 1:self.next_slot], self.v[0, :, 1:self.next_slot]
