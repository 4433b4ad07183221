"""Tier 3 for EAGLE-3: speculators' own ``Eagle3DraftModel`` (speculators 0.9, ``models/eagle3``) on the same
weights, CPU, float64, against our f64 reference.

The model is built from the spec's numbers (never ``from_pretrained``: no hub, no verifier download), its
state loaded strictly (fc, layers.0.*, norm, lm_head, d2t / t2d, the target's embedding; verifier_lm_head /
verifier_norm, training-only, get the head and ones). Its forward is the training-time test: ``ttt_steps`` = K
steps over every row of a teacher-forced sequence, step k reading the sequence's tokens and step k-1's
output, its attention mask causal over the real rows plus its own chain. A hook on ``lm_head`` keeps each
step's logits; our ``reference.drafts.eagle3.teacher_forced`` computes the same chains anchor by anchor with
the inference-time code. Float32 islands (RMSNorm, the rotary table, eager softmax) are lifted to float64 with
``bloomery_cli.oracle.hf.Float32AsFloat64``. The package and its imports (openai, datasets, ...) are optional: where
they do not import, the gate prints a note instead of the (o) lines.
"""

from __future__ import annotations

import warnings

import numpy as np

from bloomery_cli.bands import logits_band, worst_rel
from bloomery_cli.contract import Report
from bloomery_gates.reference.families.qwen3 import model as ref_qwen3
from bloomery_gates.spec import Eagle3Spec, ModelSpec

from ..reference.drafts import eagle3 as ref_eagle3


def speculators_model(d: Eagle3Spec, target: ModelSpec):
    """A float64 speculators ``Eagle3DraftModel`` carrying the spec's weights (eval mode), or raises ImportError."""
    import torch
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig, Qwen3Config

    from bloomery_cli.oracle.hf import Float32AsFloat64, hf_rope_parameters

    s = d.layer
    layer_cls = Qwen3Config if d.qk_norm else LlamaConfig
    tl = layer_cls(hidden_size=s.hidden_size, num_hidden_layers=1, num_attention_heads=s.num_heads,
                   num_key_value_heads=s.num_kv_heads, head_dim=s.head_dim, intermediate_size=s.intermediate_size,
                   vocab_size=target.vocab_size, rms_norm_eps=s.rms_eps, hidden_act="silu", attention_bias=False,
                   rope_parameters=hf_rope_parameters(s),
                   max_position_embeddings=max(4096, target.max_position))
    tl._attn_implementation = "eager"
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=d.draft_vocab_size, norm_before_residual=d.norm_before_residual,
        norm_output=d.norm_output, eagle_aux_hidden_state_layer_ids=list(d.aux_layer_ids),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=d.speculative_tokens)],
            verifier=VerifierConfig(name_or_path=None, architectures=["Qwen3ForCausalLM"])))
    with Float32AsFloat64():
        model = Eagle3DraftModel(cfg).to(torch.float64).eval()
    state = {k: v.detach().double() for k, v in d.tensors.items()}
    state["embed_tokens.weight"] = target.tensors["model.embed_tokens.weight"].detach().double()
    state["verifier_lm_head.weight"] = state["lm_head.weight"]
    state["verifier_norm.weight"] = torch.ones(s.hidden_size, dtype=torch.float64)
    if d.d2t is not None:
        state["d2t"] = d.d2t.long()
        state["t2d"] = torch.zeros(target.vocab_size, dtype=torch.bool)
        state["t2d"][d.target_ids()] = True
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"Eagle3DraftModel state dict: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    return model


def speculators_logits(d: Eagle3Spec, target: ModelSpec, ids: list[int], hidden: np.ndarray) -> list[np.ndarray]:
    """Per ttt step k = 0..K-1: logits [T-1, Vd], row i = step k+1 of the chain anchored at position i+1.
    hidden [L+1, T, H]: the target's taps over ``ids`` (aux id l = taps index l)."""
    import torch

    from bloomery_cli.oracle.hf import Float32AsFloat64

    model = speculators_model(d, target)
    steps: list[np.ndarray] = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: steps.append(out[0].detach().numpy().copy()))
    aux = torch.from_numpy(np.concatenate([hidden[l] for l in d.aux_layer_ids], axis=-1)[:-1])[None]
    x = torch.tensor([list(ids[1:])])
    try:
        with torch.no_grad(), Float32AsFloat64(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)      # transformers' past_key_values rename
            model(hidden_states=aux, input_ids=x, document_ids=torch.zeros_like(x), ttt_steps=d.speculative_tokens)
    finally:
        hook.remove()
    return steps


def check_oracle(report: Report, c, plain_ids: list[int]) -> None:
    """(o) per chain step: our reference's teacher-forced logits and draft ids against speculators'
    Eagle3DraftModel over the first prompt and the plain run's first 32 ids, both reading the reference target's
    taps; a note instead where speculators does not import."""
    d: Eagle3Spec = c.draft_spec
    seq = list(c.prompt) + list(plain_ids[:32])
    hidden = ref_qwen3.forward(c.target_spec, seq).hidden
    try:
        theirs = speculators_logits(d, c.target_spec, seq, hidden)
    except ImportError as e:
        report.note(f"(o) eagle3: speculators' Eagle3DraftModel does not import here ({type(e).__name__}: {e}); "
                    "no tier-3 line for the draft (pip install speculators==0.9.0 and its imports)")
        return
    ours = ref_eagle3.teacher_forced(d, c.target_spec, seq, hidden, d.speculative_tokens)
    band = logits_band("f64", d.layer, d.speculative_tokens + 1, len(seq) + d.speculative_tokens)
    who = "speculators Eagle3DraftModel f64"
    for k, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
        other = other[: len(mine.logits)]
        report.reference(f"eagle3 ttt step {k + 1} logits [{other.shape[0]}x{other.shape[1]}]", other.size,
                         worst_rel(mine.logits, other), band.value, tag="(o)", ref=who)
        differ = int((mine.draft_ids != other.argmax(-1)).sum())
        excused = sum(bool(a != b) and _excused(other[i], band)
                      for i, (a, b) in enumerate(zip(mine.draft_ids, other.argmax(-1), strict=True)))
        report.integer_match(f"eagle3 ttt step {k + 1} draft ids", other.shape[0], differ, excused, tag="(o)", ref=who)


def _excused(row: np.ndarray, band) -> bool:
    from bloomery_cli.bands import flip_excused

    return flip_excused(row, band)
