"""Drafts for the device-side accept loop (``kernels.accept``): graph-safe ``propose_dev`` / ``accept_dev``.

``SyntheticDraft``  the bench's replay draft (``bloomery_cli.bench.common.ReplayDraft``) on the device: window w
                    with anchor out[cnt-1] proposes, for j < m,
                        d[j] = ref[cnt + j]                 if right[w, j]   (ref padded with 0 past its end)
                             = (ref[cnt + j] + 1) mod V     otherwise
                    where right[w, j] = (the (w * draws + j)-th draw of random.Random(seed)) < a, the draws
                    ReplayDraft makes (``draws`` a window, m <= draws used), so its windows equal ReplayDraft's.
                    With ``inner`` (a real draft's device hooks) the inner draft runs first, for its cost only
                    (ReplayDraft runs its inner draft the same way).
``DFlashDev``       ``FastDFlashDraft`` (qwen3): propose with s = p0 and the anchor copied into its ``inp``, the
                    block's B-1 ids from ``ids_buf``; accept = the context extension of the window's R rows at p0
                    (what its host ``accept`` does: rows past kept lie beyond the context).
``DFlash2Dev``      ``FastDFlash2Draft`` (qwen38): the same two passes; its host ``accept`` extends the kept rows
                    only, this one extends the window's R rows (rows past kept beyond the context again; a row's
                    features may differ in the last bits with the row count, so its proposals may differ from the
                    host loop's, never its emitted ids). Used as the synthetic draft's inner cost.
"""

from __future__ import annotations

import random

import torch

T = torch.Tensor


class SyntheticDraft:
    def __init__(self, device: torch.device, vocab: int, draws: int, max_ids: int, inner=None):
        self.device, self.vocab, self.draws, self.inner = device, vocab, draws, inner
        self.table = torch.zeros(max_ids + draws + 1, dtype=torch.long, device=device)
        self.right = torch.zeros(max_ids + 4, draws, dtype=torch.bool, device=device)
        self.offs = torch.arange(draws, device=device)

    def load(self, ref: list[int], a: float, seed: int) -> None:
        """Refill the table with ``ref`` and the windows' draws (in place: captured graphs stay valid)."""
        if len(ref) > self.table.numel():
            raise ValueError(f"a reference of {len(ref)} ids; this draft holds {self.table.numel()}")
        rng = random.Random(seed)
        right = [[rng.random() < a for _ in range(self.draws)] for _ in range(self.right.shape[0])]
        self.table.zero_()
        self.table[:len(ref)].copy_(torch.tensor(ref, dtype=torch.long))
        self.right.copy_(torch.tensor(right, dtype=torch.bool))

    def prompt(self, taps: T) -> None:
        if self.inner is not None:
            self.inner.prompt(taps)

    def propose_dev(self, p0: T, anchor: T, cnt: T, w: T, m: int) -> T:
        if m > self.draws:
            raise ValueError(f"{m} proposals; this draft draws {self.draws} a window")
        if self.inner is not None:
            self.inner.propose_dev(p0, anchor, cnt, w, m)
        truth = self.table.index_select(0, cnt + self.offs[:m])
        right = self.right.index_select(0, w)[0, :m]
        return torch.where(right, truth, (truth + 1) % self.vocab)

    def accept_dev(self, p0: T, r: int) -> None:
        if self.inner is not None:
            self.inner.accept_dev(p0, r)

    def sync(self, length: int) -> None:
        if self.inner is not None:
            self.inner.sync(length)


class DFlashDev:
    def __init__(self, draft):
        self.d = draft

    def prompt(self, taps: T) -> None:
        self.d.prompt(taps)

    def propose_dev(self, p0: T, anchor: T, cnt: T, w: T, m: int) -> T:
        self.d.inp.dev[:1].copy_(p0)
        self.d.inp.dev[1:2].copy_(anchor)
        self.d._propose_pass()
        return self.d.ids_buf[:m]

    def accept_dev(self, p0: T, r: int) -> None:
        self.d._extend(self.d.target.taps_buf[:, :r], p0)

    def sync(self, length: int) -> None:
        self.d.ctx_len = length


class DFlash2Dev(DFlashDev):
    def propose_dev(self, p0: T, anchor: T, cnt: T, w: T, m: int) -> T:
        self.d._propose_pass(p0, anchor)
        return self.d.ids_buf[:m]

    def accept_dev(self, p0: T, r: int) -> None:
        self.d._extend_pass(self.d.target.taps_buf[:, :r], p0)
