"""Gate ds4-mtp: a deepseek4 (DeepSeek V4) target drafting with its in-file MTP block (``mtp.0.*``), chained.

Width 3 (verify rows 4): the one block drafts d_1 from the target's 4 RAW streams (its last layer's output before
the trained HC head) and the anchor, then d_2 and d_3 from its own recycled output streams and the draft before
(llama.cpp's V4 MTP graph recycles the 4-stream output the same way, docs/FAMILIES_MOE.md 4.4). 3 is the depth at
which a chained row reads a chained row's KV in its window and the depth the qwen38 / mimo2 MTP gates use.

(r) lines, beyond the target's: the chosen experts of every target layer over the prompt (the hash layer's against
``tid2eid`` of the prompt's ids, exactly; the sqrt-softplus layers against the host transcription of the kernel's
rule on its own float32 scores), then each drafted row (its output streams [S x H] and its logits) against
``reference.families.deepseek4.mtp.draft`` on the engine's own raw streams, following the kernel's chain ids, and
the draft ids. State after the loop: the target's window KV, compressor and indexer projections per layer and the
MTP's window KV (``gates.state_decls_deepseek4``). (o) for the draft: on a GGUF target with the MTP GGUF as the draft
(``--target X.gguf --draft mtp-X.gguf``, ``bloomery_cli.families.deepseek4.fixture_gguf``), llama.cpp's deepseek4
trunk over prompt + up to 200 plain ids (past the HCA ratio 128) and its V4 MTP graph teacher-forced
(``bloomery_cli.families.deepseek4.oracle_llamacpp``); on the HF layout a note (transformers ignores ``mtp.*``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bloomery_cli.bands import Op, layer_ops
from bloomery_cli.contract import Report
from bloomery_cli.gatekit import DraftCheck, GateDef
from bloomery_gates.kernels.families.deepseek4.mtp import Deepseek4MTPDraft
from bloomery_gates.kernels.families.ffn import record_routing
from bloomery_gates.reference.families.deepseek4 import mtp as ref_mtp
from bloomery_gates.spec import Deepseek4MTPSpec

from ..reference.ops.moe import topk_stable
from .close import close
from .fixtures import FIXTURES, PROMPTS
from .moe_checks import HOST, chosen_experts, expert_load
from .routing_flips import chained_choices
from .state_decls_deepseek4 import DEEPSEEK4_MTP_STATE
from .targets import greedy_flips, to_np

WIDTH = 3


def mtp_ops(c: DraftCheck, row: int, logits: bool) -> list[Op]:
    """Drafted row ``row`` (1-based): the target's layers, then per chained step the input norms, eh_proj (2H) and
    one mHC layer; logits add the MTP's HC head and norm, and the head."""
    t = c.target_spec
    h, seq = t.hidden_size, len(c.prompt) + row
    trunk = layer_ops(t.layer, len(c.prompt)) * t.num_layers
    step = [Op("enorm / hnorm", h), Op("eh_proj", 2 * h), *layer_ops(t.layer, seq)]
    return trunk + step * row + ([Op("hc_head", t.hc.count * h), Op("norm", h), Op("lm head", h)] if logits else [])


def check_routing(report: Report, c: DraftCheck) -> None:
    """Tier 1 over the prompt: a hash layer's ids are tid2eid[ids] exactly; a sqrt-softplus layer's the host
    top-k (``topk_stable``) of its own float32 choice scores s + bias."""
    spec, routings = c.target_spec, c.prefill.routing or {}
    if len(routings) != spec.num_layers:
        report.integer_match("target routed layers", spec.num_layers, spec.num_layers - len(routings), 0, ref=HOST)
        return
    tok = np.asarray(c.prompt, dtype=np.int64)
    for l, kind in enumerate(spec.mlp_types):
        r = routings[l]
        if kind == "hash":
            got = r.ids.detach().cpu().numpy()
            want = spec.tensors[f"model.layers.{l}.mlp.gate.tid2eid"].numpy().astype(np.int64)[tok]
            report.facts.setdefault("expert_load", {})[f"target layer {l}"] = expert_load(got, spec.moe.num_experts)
            report.integer_match(f"target layer {l} (hash) chosen experts [{got.shape[0]}x{got.shape[1]}]",
                                 got.shape[0], int((got != want).any(-1).sum()), 0, ref="tid2eid[ids]")
        else:
            chosen_experts(report, f"target layer {l}", r, lambda ch: topk_stable(ch, spec.moe.top_k))


def check_draft(report: Report, c: DraftCheck) -> None:
    check_routing(report, c)
    spec: Deepseek4MTPSpec = c.draft_spec
    anchor = c.prefill.argmax[-1]
    c.draft.prompt(c.prefill.taps)
    with record_routing() as calls:
        got = c.draft.propose(anchor, detail=True)
    streams = to_np(c.prefill.taps[-1])
    ref, emu = chained_choices(             # the MTP's router with the kernel's choices (routing_flips)
        report, "mtp: ", lambda: ref_mtp.draft(spec, c.target_spec, c.prompt, streams, anchor, c.draft.width,
                                               chain_ids=got.ids),
        [r for _, r in calls], len(c.prompt), c.draft.width, c.dtype, lambda k: mtp_ops(c, k + 1, logits=False))
    y, logits = to_np(got.layer_out[0]), to_np(got.logits)
    s, h, v = y.shape[1], y.shape[2], logits.shape[1]
    for i in range(y.shape[0]):
        close(report, f"mtp row {i + 1} out streams [{s}x{h}]", y[i], ref.y[i], emu.y[i], c.dtype,
              mtp_ops(c, i + 1, logits=False))
    bands = [close(report, f"mtp row {i + 1} logits [1x{v}]", logits[i], ref.logits[i], emu.logits[i], c.dtype,
                   mtp_ops(c, i + 1, logits=True)) for i in range(logits.shape[0])]
    differ, excused = greedy_flips(logits, ref.logits, max(bands, key=lambda b: b.value))
    report.integer_match("mtp draft ids", logits.shape[0], differ, excused)


ORACLE_IDS = 200                  # plain ids in the llama.cpp (o) lines: past position 128 (llama.cpp's HCA ratio)


def check_oracle(report: Report, c: DraftCheck, plain_ids: list[int]) -> None:
    from bloomery_cli.oracle.llamacpp import is_gguf_target

    if not is_gguf_target(c.target_spec):
        report.note("(o) mtp: no outside oracle for the V4 MTP in the HF layout (transformers ignores mtp.*); "
                    "llama.cpp's runs on the GGUF pair (--target X.gguf --draft mtp-X.gguf)")
        return
    from bloomery_cli.families.deepseek4.oracle_llamacpp import check_v4

    check_v4(report, c.target_spec, c.draft_spec, list(c.prompt) + list(plain_ids[:ORACLE_IDS]))


def load_draft(path: Path, target) -> Deepseek4MTPSpec:
    from bloomery_cli.families.deepseek4.reader_mtp import deepseek4_mtp_from_file

    return deepseek4_mtp_from_file(Path(path), target)


def describe(d: Deepseek4MTPSpec) -> dict:
    return {"width": WIDTH, "verify_rows": WIDTH + 1, "mtp_layers": d.num_layers,
            "mtp_input": "the target's 4 raw streams (before its HC head); output streams recycled",
            "format": d.source_format}


GATE = GateDef(
    name="ds4-mtp", family="deepseek4", draft_kind="mtp",
    target=FIXTURES / "ds4-tiny", draft=FIXTURES / "ds4-tiny", prompts=PROMPTS,
    about="deepseek4 (DeepSeek V4) target: sliding / CSA / HCA attention, hash + sqrt-softplus MoE, mHC; its "
          "in-file MTP block chained 3 deep on its recycled streams, own window KV",
    load_draft=load_draft,
    make_draft=lambda spec, engine, max_len: Deepseek4MTPDraft(spec, engine, max_len, WIDTH),
    block=lambda d: WIDTH + 1, describe=describe, check_draft=check_draft,
    draft_state=DEEPSEEK4_MTP_STATE, check_draft_oracle=check_oracle,
)
