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

    def start(self, taps: T) -> None:
        if self.inner is not None:
            self.inner.start(taps)

    def prime(self, first: int) -> None:
        if self.inner is not None:
            self.inner.prime(first)

    def propose_dev(self, p0: T, anchor: T, cnt: T, w: T, m: int) -> T:
        if m > self.draws:
            raise ValueError(f"{m} proposals; this draft draws {self.draws} a window")
        if self.inner is not None:
            self.inner.propose_dev(p0, anchor, cnt, w, m)
        truth = self.table.index_select(0, cnt + self.offs[:m])
        right = self.right.index_select(0, w)[0, :m]
        return torch.where(right, truth, (truth + 1) % self.vocab)

    def accept_dev(self, p0: T, r: int, kept: T) -> None:
        if self.inner is not None:
            self.inner.accept_dev(p0, r, kept)

    def sync(self, length: int) -> None:
        if self.inner is not None:
            self.inner.sync(length)

    def keep(self) -> tuple[T, ...]:
        return () if self.inner is None else self.inner.keep()


class DFlashDev:
    def __init__(self, draft):
        self.d = draft

    def start(self, taps: T) -> None:
        self.d.prompt(taps)

    def prime(self, first: int) -> None:
        pass

    def propose_dev(self, p0: T, anchor: T, cnt: T, w: T, m: int) -> T:
        self.d.inp.dev[:1].copy_(p0)
        self.d.inp.dev[1:2].copy_(anchor)
        self.d._propose_pass()
        return self.d.ids_buf[:m]

    def accept_dev(self, p0: T, r: int, kept: T) -> None:
        self.d._extend(self.d.target.taps_buf[:, :r], p0)

    def sync(self, length: int) -> None:
        self.d.ctx_len = length

    def keep(self) -> tuple[T, ...]:
        return ()


class DFlash2Dev(DFlashDev):
    def propose_dev(self, p0: T, anchor: T, cnt: T, w: T, m: int) -> T:
        self.d._propose_pass(p0, anchor)
        return self.d.ids_buf[:m]

    def accept_dev(self, p0: T, r: int, kept: T) -> None:
        self.d._extend_pass(self.d.target.taps_buf[:, :r], p0)


class MTPDev:
    """``FastMTPDraft`` (qwen38) on the device. ``start`` is the host's prompt (the prompt's rows written: the
    draft's prefill) and ``prime`` its first propose (the anchor's row written, the first proposals in
    ``ids_buf``). A window's accept (p0 the window's first position, a = the target's argmax [R], h =
    final_norm(taps[-1]) [R, H]) is the next window's propose:

        rows    (embed(a[j]), h[j]) at slots p0+1+j, j < R: for j < kept they are the rows the host queue would write
                (tokens d_{j+1} = a[j] while accepted, then the next anchor a[kept-1]); rows past kept land past the
                next anchor's slot, overwritten by the chained rows or the next window before any row attends them
        chain   from the output of row kept-1 (gathered by index), width drafts at slots p0+kept+i, into ``ids_buf``

    The rows of one pass are R here and ``kept`` in the host's queue: a projection's rows may round apart with the
    row count, so the proposals may differ from the host loop's in rare windows, never the emitted ids. After a
    device run the host queue is not rebuilt (``sync``: start again with a prefill)."""

    def __init__(self, draft):
        self.d = draft

    def start(self, taps: T) -> None:
        self.d.prompt(taps)

    def prime(self, first: int) -> None:
        self.d.propose(first)

    def propose_dev(self, p0: T, anchor: T, cnt: T, w: T, m: int) -> T:
        return self.d.ids_buf[:m]

    def accept_dev(self, p0: T, r: int, kept: T) -> None:
        d, t = self.d, self.d.target
        e = torch.index_select(d.embed, 0, t.argmax_buf[:r])
        h = d.ops.rms(t.taps_buf[-1][:r], d.final_gain, d.eps)
        y = d._rows(e, h, p0 + 1).index_select(0, (kept - 1).clamp(min=0))
        g = d.ops.rms(y, d.norm, d.eps)
        for i in range(d.width):
            if i:
                x = torch.index_select(d.embed, 0, d.ids_buf[i - 1:i])
                g = d.ops.rms(d._rows(x, g, p0 + kept + i), d.norm, d.eps)
            torch.mm(g, d.head.t(), out=d.logits_buf[i:i + 1])
            torch.argmax(d.logits_buf[i:i + 1], dim=-1, out=d.ids_buf[i:i + 1])

    def sync(self, length: int) -> None:
        d = self.d
        d.next_slot, d.anchor_written = length + 1, True
        d.pend_e, d.pend_h, d.last_h = d.pend_e[:0], d.pend_h[:0], None

    def keep(self) -> tuple[T, ...]:
        return (self.d.ids_buf,)
