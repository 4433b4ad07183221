"""Gate qwen3-eagle3: a Qwen3 target drafting with an EAGLE-3 head (speculators ``eagle3`` layout).

Width K = the checkpoint's own ``speculative_tokens`` (speculators_config's greedy proposal method; 3 on the
fixture, the serving setting vLLM / SGLang document for EAGLE-3 and speculators' default ttt_steps): K chained
drafts per window, verify rows K + 1.

The (r) lines, beside the target's:
- the first window after the first prompt, each chain row against ``reference.drafts.eagle3`` run on the engine's
  own target taps (so they measure the draft alone, from the aux rows on) and following the kernel's own chain
  ids: the layer output, the draft-vocab logits, and the drafted target ids (argmax mapped through d2t; a flip
  is excused only inside the reference's top-2 margin band, a mapping error never);
- the draft's store after a drafted run of ``STATE_IDS`` ids on the first prompt (windows that kept all, some
  or none of the drafts behind it): its next proposal against the reference's fresh run over every committed
  id, reading the very target taps the draft was given. Entries the draft wrote from its own output and did not
  roll back, or kept positions not rewritten from the target's rows, show here and nowhere else (losslessness
  cannot see them: the target verifies every draft).
``check_oracle`` is the tier-3 line against speculators' own ``Eagle3DraftModel`` (``gates.eagle3_oracle``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bloomery_cli.bands import Op, flip_excused, layer_ops
from bloomery_cli.contract import Report
from bloomery_cli.gatekit import DraftCheck, GateDef
from bloomery_cli.loading import load_eagle3
from bloomery_cli.speculative import generate
from bloomery_gates.spec import Eagle3Spec

from ..kernels.drafts.eagle3 import Eagle3Draft
from ..reference.drafts import eagle3 as ref_eagle3
from .close import close, exact_and_emulated
from .fixtures import FIXTURES, PROMPTS
from .targets import to_np

STATE_IDS = 48          # ids of the drafted run behind the state lines


def eagle3_ops(c: DraftCheck, row: int, seq: int, logits: bool) -> list[Op]:
    """Row ``row`` (1-based) of a chain: the aux fc (n = len(ids) H), then per chained step one draft layer (its
    q/k/v over 2H columns) and, with norm_output, the norm fed on; logits add the final norm and the head."""
    d: Eagle3Spec = c.draft_spec
    h = d.layer.hidden_size
    step = [Op("input / hidden norms", h)] + [Op(o.name, 2 * h) if o.name == "q/k/v proj" else o
                                               for o in layer_ops(d.layer, seq)[1:]]
    between = [Op("norm (norm_output)", h)] if d.norm_output else []
    ops = [Op("aux fc", len(d.aux_layer_ids) * h)] + (step + between) * (row - 1) + step
    return ops + ([Op("norm", h), Op("lm head", h)] if logits else [])


def id_flips(got, ref: ref_eagle3.Eagle3RefOut, band) -> tuple[int, int]:
    """(rows whose target id differs, of those the ones excused: the draft-vocab argmax flipped inside the
    reference's top-2 margin band). A row whose argmax agrees but whose target id does not is a mapping error."""
    differ = [i for i in range(len(got.ids)) if got.ids[i] != int(ref.ids[i])]
    excused = sum(got.draft_ids[i] != int(ref.draft_ids[i]) and flip_excused(ref.logits[i], band) for i in differ)
    return len(differ), excused


def check_rows(report: Report, c: DraftCheck, got, ref, emu, head: str, seq: int) -> None:
    """One line per chain row for the layer output, one per row for the logits, one for the ids."""
    layer_out, logits = to_np(got.layer_out[0]), to_np(got.logits)
    h, v = layer_out.shape[1], logits.shape[1]
    for i in range(layer_out.shape[0]):
        close(report, f"{head}eagle3 row {i + 1} layer out [1x{h}]", layer_out[i], ref.layer_out[i],
              emu.layer_out[i], c.dtype, eagle3_ops(c, i + 1, seq, logits=False))
    bands = [close(report, f"{head}eagle3 row {i + 1} logits [1x{v}]", logits[i], ref.logits[i], emu.logits[i],
                   c.dtype, eagle3_ops(c, i + 1, seq, logits=True)) for i in range(logits.shape[0])]
    differ, excused = id_flips(got, ref, max(bands, key=lambda b: b.value))
    report.integer_match(f"{head}eagle3 draft ids (d2t-mapped target ids)", logits.shape[0], differ, excused)


class TapRecorder:
    """The target engine as the loop drives it, keeping what the draft was fed: the prompt's taps, each window's
    kept taps and tokens, and the last emitted id (the next anchor)."""

    def __init__(self, engine):
        self.engine, self.device = engine, engine.device
        self.taps, self.tokens, self.anchor = [], [], None

    def prefill(self, ids: list[int]):
        p = self.engine.prefill(ids)
        self.taps, self.tokens, self.anchor = [p.taps], [], p.argmax[-1]
        return p

    def verify(self, ids: list[int]):
        self._ids, self._pass = ids, self.engine.verify(ids)
        return self._pass

    def commit(self, kept: int) -> None:
        self.engine.commit(kept)
        self.taps.append(self._pass.taps[:, :kept])
        self.tokens.extend(self._ids[:kept])
        self.anchor = self._pass.argmax[kept - 1]


def check_state(report: Report, c: DraftCheck) -> None:
    """(r) state after W windows: the draft's next proposal vs the reference over every committed id."""
    rec = TapRecorder(c.engine)
    run = generate(rec, c.draft, c.prompt, STATE_IDS)
    got = c.draft.propose(rec.anchor, detail=True)
    hidden = np.concatenate([to_np(t) for t in rec.taps], axis=1)
    ids = list(c.prompt) + rec.tokens
    ref, emu = exact_and_emulated(c.dtype, lambda: ref_eagle3.draft(c.draft_spec, c.target_spec, ids, hidden,
                                                                    rec.anchor, c.draft.width, chain_ids=got.ids))
    tally = run.tally
    rejected = sum(k <= p for p, k in zip(tally.proposed, tally.kept, strict=True))
    report.note(f"state run: prompt 0, {STATE_IDS} ids, {tally.windows} drafted windows, {rejected} of them "
                f"rejected a draft (the store rolled back {rejected} times)")
    check_rows(report, c, got, ref, emu, f"state after {tally.windows} windows: ", len(ids) + c.draft.width)


def check_draft(report: Report, c: DraftCheck) -> None:
    anchor = c.prefill.argmax[-1]
    c.draft.prompt(c.prefill.taps)
    got = c.draft.propose(anchor, detail=True)
    hidden = to_np(c.prefill.taps)
    ref, emu = exact_and_emulated(c.dtype, lambda: ref_eagle3.draft(c.draft_spec, c.target_spec, c.prompt, hidden,
                                                                    anchor, c.draft.width, chain_ids=got.ids))
    check_rows(report, c, got, ref, emu, "", len(c.prompt) + c.draft.width)
    check_state(report, c)


def check_oracle(report: Report, c: DraftCheck, plain_ids: list[int]) -> None:
    from .eagle3_oracle import check_oracle as speculators_line

    speculators_line(report, c, plain_ids)


def describe(d: Eagle3Spec) -> dict:
    return {"width": d.speculative_tokens, "verify_rows": d.speculative_tokens + 1,
            "aux_layers": list(d.aux_layer_ids), "draft_vocab": d.draft_vocab_size,
            "layer": "qwen3" if d.qk_norm else "llama", "norm_before_residual": d.norm_before_residual,
            "norm_output": d.norm_output}


GATE = GateDef(
    name="qwen3-eagle3", family="qwen3", draft_kind="eagle3",
    target=FIXTURES / "qwen3-tiny", draft=FIXTURES / "qwen3-tiny-eagle3", prompts=PROMPTS,
    about="Qwen3 target + EAGLE-3 head (speculators layout): K chained drafts per window from 3 aux hidden "
          "rows, own KV store, reduced draft vocab (d2t)",
    load_draft=lambda path, target: load_eagle3(Path(path), target),
    make_draft=lambda spec, engine, max_len: Eagle3Draft(spec, engine, max_len),
    own_ids=STATE_IDS,
    block=lambda d: d.speculative_tokens + 1, describe=describe, check_draft=check_draft,
    anchors=("anchor (external, z-lab DFlash report, Qwen3-8B T=0 on B200): EAGLE-3 tau 2.89 GSM8K, 3.04 code "
             "avg, 2.70 chat avg; DSpark paper (T=1, B=7): Qwen3-8B GSM8K EAGLE-3 5.30",),
    check_draft_oracle=check_oracle,
)
