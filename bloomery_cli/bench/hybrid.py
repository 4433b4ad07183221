"""``bloomery bench qwen38-dflash2 | qwen38-mtp --shape qwen38-27b``: the hybrid target's decode speed.

    bloomery bench qwen38-dflash2 --shape qwen38-27b --device cuda [--block 8] [--layers 16] [--hf]
    bloomery bench qwen38-mtp --shape qwen38-27b --device cuda [--width 3]
    bloomery bench qwen38-mtp --shape qwen38-tiny --device cpu -n 24            (the tests' shape)

One run, random weights made on the device (``bench_hybrid_shapes``), batch 1, greedy; each figure with its
conditions:
- copy bandwidth; the roofline tok/s = bandwidth / weight bytes; ``roofline_read`` = bandwidth / the bytes a
  step reads (every trunk matrix and the head once, one embedding row; the MTP / draft tensors are not part
  of a plain step);
- plain decode tok/s (one row a pass) and its ratios to both rooflines;
- the cost of a verify of R rows, R = 1..max(16, B), over one plain step (wall time, device synchronised);
- the draft's cost per block (DFlash2: B-1 drafts; MTP: its chained drafts) over one plain step;
- drafted tok/s over synthetic acceptance: the replay draft (``bench.ReplayDraft``) runs the real draft (its
  cost) and proposes the target's own continuation, each proposal right with probability a. DFlash2: a from
  tau in (1, 2, 3, 4, 6, 8, ...) <= B; MTP: a in (0.5, 0.7, 0.8, 0.9, 1.0). The criterion line compares the
  drafted tok/s with 0.85 x accept_mean x plain at tau 6 (DFlash2) or a = 0.8 (MTP); reported, not asserted;
- ids identical: every drafted run's ids against the plain run padded to the drafted width (same shapes:
  equal by construction), ASSERTED: a difference makes the bench exit 1;
- with ``hf``: transformers' Qwen3_5ForCausalLM eager ``generate`` on the same tensors, and our ratio to it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from ..gatekit import resolve_device
from ..results.records import conditions
from .chain import host_share
from .common import (
    DTYPES,
    TAUS,
    accept_for_tau,
    criterion_bound,
    guarded,
    hf_compare,
    padded_reference,
    plain_row,
    roofline,
    stages,
    sync,
    timed_generate,
    verify_costs,
)
from .dflash2 import copy_bandwidth
from .hybrid_engines import build_hybrid_engines
from .hybrid_shapes import HYBRID_SHAPES, hf_qwen38_model, random_dflash2, random_qwen38
from .llamacpp import compare
from .shapes import weight_bytes
from .sweep import Point, run_sweep

NAMES = ("qwen38-dflash2", "qwen38-mtp")
MTP_ACCEPTS = (0.5, 0.7, 0.8, 0.9, 1.0)


def check_args(name: str, shape: str, layers: int | None, block: int | None, mtp_width: int) -> None:
    """Named ValueErrors (the CLI turns them into exit 2) before any device work."""
    if name not in NAMES:
        raise ValueError(f"--shape {shape}: a hybrid shape runs {' or '.join(NAMES)}, not {name!r}")
    if shape not in HYBRID_SHAPES:
        raise ValueError(f"--shape {shape!r}: expected one of {', '.join(HYBRID_SHAPES)}")
    s = HYBRID_SHAPES[shape]
    if layers is not None and not 1 <= layers <= s.layers:
        raise ValueError(f"--layers {layers}: expected 1..{s.layers} for {shape}")
    if block is not None and not 2 <= block <= 32:
        raise ValueError(f"--block {block}: expected 2..32")
    if not 1 <= mtp_width <= 8:
        raise ValueError(f"--mtp-width {mtp_width}: expected 1..8 chained drafts")


def read_bytes(spec) -> int:
    """Bytes a plain step reads: the trunk's matrices, the norms and the head whole, one embedding row."""
    t = dict(spec.tensors)
    emb = t.pop("model.embed_tokens.weight")
    return weight_bytes(t) + emb.shape[1] * emb.element_size()


def bench_hybrid(name: str, shape: str, device: str = "auto", dtype: str = "bf16", prompt_len: int = 512,
                 n: int = 256, layers: int | None = None, block: int | None = None, mtp_width: int = 3,
                 width: str = "fixed", hf: bool = False, hf_tokens: int = 16, iters: int | None = None,
                 emit=print, quiet: bool = False, save=lambda rec: None, profile: bool = False,
                 llama_bench: Path | None = None) -> dict[str, Any]:
    """Run the hybrid bench; ``save(rec)`` after each stage (a run cut short keeps what it measured);
    ``llama_bench``: also llama.cpp's plain decode on the same trunk (``bench_llamacpp.compare``)."""
    check_args(name, shape, layers, block, mtp_width)
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    dev = resolve_device("cuda" if device == "auto" and torch.cuda.is_available() else
                         ("cpu" if device == "auto" else device))
    dt, s = DTYPES[dtype], HYBRID_SHAPES[shape]
    iters = iters or (10 if dev.type == "cuda" else 2)
    mtp = name == "qwen38-mtp"
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        emit(line)

    rec: dict[str, Any] = {"bench": name, "shape": shape, "complete": False, "lines": lines, "shape_facts": s.facts()}
    with stages(8 + hf + profile + (llama_bench is not None), quiet) as step:
        step("bandwidth")
        bw = copy_bandwidth(dev, (2 << 30) if dev.type == "cuda" else (1 << 26))
        step("weights")
        t0 = time.perf_counter()
        tspec, mspec = random_qwen38(s, dev, dt, layers)
        b = mtp_width + 1 if mtp else (block or 8)
        dspec = None if mtp else random_dflash2(s, tspec, b, dev, dt)
        gen = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, s.vocab, (prompt_len,), generator=gen).tolist()
        sync(dev)
        wb, rb = weight_bytes(tspec.tensors), read_bytes(tspec)
        draft_b = weight_bytes(mspec.tensors if mtp else dspec.tensors)
        log(f"bench {name} shape={shape} layers={tspec.num_layers}/{s.layers} device={dev} "
            f"device_name={conditions(dev)['device_name']!r} dtype={dtype} prompt_len={prompt_len} batch=1 "
            f"width={width} n={n} verify_rows={b}")
        log(f"weights bytes={wb} read_per_step={rb} draft_bytes={draft_b} made_s={time.perf_counter() - t0:.1f} "
            + (f"mtp_width={mtp_width}" if mtp else f"draft_layers={dspec.num_layers} block={b} "
               f"target_layers={list(dspec.target_layer_ids)}"))
        roof = roofline(bw, wb, rb, log)
        max_len = prompt_len + n + 4 * max(b, 16)
        target, draft, mode = build_hybrid_engines(tspec, None if mtp else dspec, mspec if mtp else None, dev, dt,
                                                   max_len, max(16, b), mtp_width, log)
        cond = {"device": str(dev), "dtype": dtype, "prompt_len": prompt_len, "batch": 1, "width": width, "n": n,
                "layers": tspec.num_layers, "verify_rows": b, "engine": mode}
        rec.update(conditions=conditions(dev) | cond, bandwidth=roof, weights={"bytes": wb, "read_per_step": rb,
                                                                                "draft_bytes": draft_b})

        step("plain decode")
        t0 = time.perf_counter()
        target.prefill(prompt)
        sync(dev)
        rec["prefill_s"] = time.perf_counter() - t0
        plain, plain_tok_s = timed_generate(target, None, prompt, n)
        rec["plain"] = plain_row(plain, plain_tok_s, roof, log, f" prefill_s={rec['prefill_s']:.2f}")
        step("host share")
        guarded(rec, "host", log, lambda: host_share(target, prompt, plain.ids, 1e3 / plain_tok_s, iters=iters,
                                                     log=log, roofline_read_tok_s=roof["roofline_read_tok_s"]))
        if llama_bench is not None:
            step("llama.cpp")
            compare(rec, llama_bench, tspec, dtype, prompt_len, n, dev, log)
        save(rec)

        step("verify widths")
        rec["verify"] = verify_costs(target, prompt, max(16, b), iters, log)
        step("draft cost")
        rec["draft"] = _draft_cost(target, draft, prompt, iters, rec["verify"][0]["ms"], mtp, log)
        head = weight_bytes({"head": tspec.head_weight()})
        passes = mtp_width if mtp else 1                 # MTP: each chained draft runs its layer and the head
        rec["bound"] = criterion_bound(rec["verify"], b, passes * (draft_b + head), roof["copy_GBps"], log)
        save(rec)
        if profile:
            from .profile import profile_engine

            step("profile")
            rec["profile"] = profile_engine(target, draft, prompt, rec["verify"], rec["draft"]["block_ms"],
                                            roof["copy_GBps"], log)
            save(rec)

        step("reference")
        ref = padded_reference(target, prompt, n, b, plain, rec, log)

        step("acceptance sweep")
        target.rows = b
        accepts = MTP_ACCEPTS if mtp else tuple(accept_for_tau(t, b) for t in TAUS if t <= b)
        points = [_point(a, b, mtp) for a in accepts]
        rec["sweep"] = []
        guarded(rec, "sweep_run", log, lambda: run_sweep(target, draft, ref, prompt, n, width, b, points,
                                                         plain_tok_s, rec, log, save, profile))
        target.rows = None
        ok = bool(rec["sweep"]) and all(r["ids_identical"] for r in rec["sweep"])
        rec["ids_identical_all"] = ok
        log(f"ids identical {n} in every drafted run: {ok} ({len(rec['sweep'])} runs)")
        if hf:
            step("transformers")
            rec["hf"] = hf_compare(tspec, target, dev, prompt, hf_tokens, plain, plain_tok_s, log,
                                   build=hf_qwen38_model, label="transformers Qwen3_5ForCausalLM generate")
        save(rec)
    rec["complete"] = True
    save(rec)
    return rec


def _draft_cost(target, draft, prompt, iters, step_ms, mtp, log) -> dict[str, Any]:
    """Device ms of the draft's block: one propose stages its inputs (MTP: the anchor's row at its slot; DFlash2:
    the anchor and the context length), then that pass's graph replayed back to back (each replay rewrites the
    same slots), as the dense bench times its draft and as the verify costs are timed."""
    from bloomery_gates.kernels.graphs import time_replays

    first = target.prefill(prompt)
    draft.prompt(first.taps)
    draft.propose(first.argmax[-1])
    gs, key = (draft.graphs, 1) if mtp else (draft.propose_graph, 0)    # MTP: the one-row pass; its inputs staged
    ms = time_replays(lambda: gs.run(key), target.device, iters) * 1e3
    graphed = gs.enabled
    what = (f"mtp chain={draft.width}" if mtp else f"dflash2 layers={draft.spec.num_layers} block={draft.b}") + \
        f" graphs={'on' if graphed else 'off'}"
    log(f"draft block_ms={ms:.3f} rel_plain_step={ms / step_ms:.3f} {what}")
    return {"block_ms": ms, "rel_plain_step": ms / step_ms}


def _point(a: float, b: int, mtp: bool) -> Point:
    """The sweep's point at acceptance a: tau = sum_j<b a^j, the criterion at a = 0.8 (MTP) or tau = 6 (DFlash2)."""
    tau = sum(a ** j for j in range(b))
    crit = ("a=0.8" if a == 0.8 else None) if mtp else ("tau=6" if abs(tau - 6.0) < 1e-6 else None)
    return Point(a, tau, int(a * 1000), f"a={a:.4f} tau={tau:.2f}", crit)
