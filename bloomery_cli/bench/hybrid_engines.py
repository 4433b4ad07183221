"""The hybrid bench's engines: ``FastQwen38Target`` (kernels/families/qwen38/fast.py) and its draft, on the fastest
path that runs, as ``bench.build_engines`` does for qwen3: Triton ops + CUDA graphs, torch ops + CUDA graphs, eager
(torch ops, no graphs; the only path on a CPU). The drafts are ``FastMTPDraft`` / ``FastDFlash2Draft`` (their
propose steps, and DFlash2's context extension, graphed too). Each path is built, prefilled on a short prompt,
captured (verify of every width 1..W, commit of every k, the draft's passes: no capture lands inside a timed run) and
driven through one drafted window; a path that fails is logged with its reason and the next one is tried."""

from __future__ import annotations

import time

import torch

from .common import first_engine, sync

Path = tuple[str, str, bool]           # (impl, attention, graphs)


def engine_paths(dev: torch.device, impl: str = "auto", graphs: bool = True) -> list[Path]:
    """(impl, attention, graphs) in the order tried: on CUDA the asked impl with graphs (its attention, then the
    masked-matmul attention: the flash-decoding kernel is the piece least tried at head_dim 256), torch with graphs,
    torch eager; on a CPU torch eager."""
    if dev.type != "cuda":
        return [("torch", "torch", False)]
    return list(dict.fromkeys([(impl, "auto", graphs), (impl, "torch", graphs), ("torch", "torch", graphs),
                               ("torch", "torch", False)]))


def build_hybrid_engines(tspec, dspec, mspec, dev: torch.device, dtype: torch.dtype, max_len: int, width: int,
                         mtp_width: int, log, paths: list[Path] | None = None):
    """(target, draft, mode): ``dspec`` a DFlash2 spec or ``mspec`` an MTP spec (the other None); ``width`` the
    widest verify the bench runs; ``paths`` (impl, attention, graphs) to try in order (default ``engine_paths``)."""
    from bloomery_gates.kernels.drafts.dflash2_fast import FastDFlash2Draft
    from bloomery_gates.kernels.drafts.mtp_fast import FastMTPDraft
    from bloomery_gates.kernels.families.qwen38.fast import FastQwen38Target

    def build(im, att, gr):
        t = FastQwen38Target(tspec, dev, dtype, max_len, max_width=width, graphs=gr, impl=im, attention=att)
        if mspec is not None:
            d = FastMTPDraft(mspec, t, max_len, width=mtp_width, graphs=gr)
        else:
            d = FastDFlash2Draft(dspec, t, max_len, impl="torch" if im == "torch" else "auto", graphs=gr)
        t0 = time.perf_counter()
        first = t.prefill([1, 2, 3])
        d.prompt(first.taps)
        t.capture(range(1, width + 1))
        d.capture()
        anchor = first.argmax[-1]
        v = t.verify([anchor, *d.propose(anchor).ids])
        t.commit(1)
        d.accept(1, v.taps)
        sync(dev)
        mode = (f"qwen38 fast ops={t.ops.name} delta_rule={t.impl} attention={t.attention} "
                f"graphs={'on' if t.graphs.enabled else 'off'}")
        return t, d, mode, time.perf_counter() - t0

    return first_engine(paths or engine_paths(dev), build, lambda p: f"impl={p[0]} attention={p[1]} graphs={p[2]}",
                        dev, log, what="hybrid engine")
