"""FAIL-first in bf16 (the dtype of the H200 records): subtle kernel defects that the worst-case chain
bands let through in bf16 must now fail the emulated bands (``bloomery_cli.bands.emulated_band``).

Each test plants one defect with monkeypatch, runs the real gate on the trained fixtures in bf16 on the
CPU (fewer ids and prompts to stay quick), and asserts exit 1 and which (r) line caught it. A control
run of each gate passes in bf16. Each of these defects passed the worst-case chain bands in bf16 (0.41 per
layer, 0.8-2.5 on logits and draft lines): the kernels' errors they cause are well under those bands.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gate_run import failed, run_named

from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.kernels.drafts import dflash as kdflash
from bloomery_gates.kernels.drafts import dspark as kdspark
from bloomery_gates.kernels.families.qwen3 import model as kqwen3
from bloomery_gates.kernels.families.qwen38 import model as kqwen38
from bloomery_gates.kernels.ops import gated_deltanet as kdelta

pytestmark = pytest.mark.skipif(not (FIXTURES / "qwen3-tiny").is_dir(), reason="fixtures/ not built")


def gate(name: str, dtype: str = "bf16"):
    return run_named(name, 32, 1, dtype=dtype)




@pytest.mark.parametrize("name", ["qwen3-dflash", "qwen3-dspark", "qwen38-mtp"])
def test_control_passes_in_bf16(name):
    code, lines = gate(name)
    assert code == 0, "\n".join(lines)


def wrong_eps(monkeypatch):
    """RMSNorm with epsilon 1e-3 instead of the config's 1e-6 (every norm of target and draft)."""
    real = kqwen3.rms_norm
    monkeypatch.setattr(kqwen3, "rms_norm", lambda x, w, eps: real(x, w, 1e-3))


def qk_norm_swapped(monkeypatch):
    """q normed with k_norm's gain and k with q_norm's (the target's attention)."""
    real_q, real_kv = kqwen3.project_q, kqwen3.project_kv

    def swap(w):
        return kqwen3.LayerWeights(**{**w.__dict__, "q_norm": w.k_norm, "k_norm": w.q_norm})

    monkeypatch.setattr(kqwen3, "project_q", lambda a, w, *r: real_q(a, swap(w), *r))
    monkeypatch.setattr(kqwen3, "project_kv", lambda a, w, *r: real_kv(a, swap(w), *r))


def feature_layers_off_by_one(monkeypatch):
    """The DFlash draft reads target layer l_j + 1 instead of l_j (HF's index taken for ours)."""
    real = kdflash.context_features
    monkeypatch.setattr(kdflash, "context_features",
                        lambda taps, layer_ids, *a: real(taps, [l + 1 for l in layer_ids], *a))


def draft_mlp_gelu(monkeypatch):
    """The draft's MLP with gelu instead of silu (the target's MLP stays right)."""
    real = kdflash.decoder_layer

    def layer(*args, **kw):
        swiglu = kqwen3.swiglu
        kqwen3.swiglu = lambda x, wg, wu, wd: F.linear(F.gelu(F.linear(x, wg)) * F.linear(x, wu), wd)
        try:
            return real(*args, **kw)
        finally:
            kqwen3.swiglu = swiglu

    monkeypatch.setattr(kdflash, "decoder_layer", layer)


def markov_prev_off_by_one(monkeypatch):
    """Row k's Markov term reads W1[prev_{k-1}] (the chain it reports stays right)."""
    def decode(base, anchor, w1, w2):
        b = base.shape[0]
        prev = torch.empty(b, dtype=torch.long, device=base.device)
        prev[:1] = anchor
        logits = torch.empty_like(base)
        for k in range(b):
            j = max(k - 1, 0)
            logits[k] = base[k] + F.linear(F.embedding(prev[j:j + 1], w1), w2)[0]
            if k + 1 < b:
                prev[k + 1] = logits[k].argmax()
        return logits, prev

    monkeypatch.setattr(kdspark, "markov_decode", decode)


def delta_rule_order(monkeypatch):
    """The delta rule's error term read from the state BEFORE the decay: u = b (v - S_{t-1}^T k)."""
    def step(s, q, k, v, g, b):
        u = b[..., None] * (v - torch.einsum("...kv,...k->...v", s, k))
        s = s * g.exp()[..., None, None] + k[..., :, None] * u[..., None, :]
        return torch.einsum("...kv,...k->...v", s, q), s

    monkeypatch.setattr(kdelta, "delta_step", step)


def prefill_decay_halved(monkeypatch):
    """The prefill's chunked delta rule reads the log-decay at half strength (g / 2)."""
    real = kqwen38.delta_chunked
    monkeypatch.setattr(kqwen38, "delta_chunked", lambda q, k, v, g, b, state=None, chunk=64:
                        real(q, k, v, g / 2, b, state, chunk))


def confidence_bias_dropped(monkeypatch):
    """DSpark's confidence head without its bias: conf_k = proj . [hn_k ; W1[prev_k]] (a small shift)."""
    def logits(self, hn, prev):
        e = F.embedding(prev, self.w1) if self.w1 is not None else hn[:, :0]
        return F.linear(torch.cat([hn, e], -1), self.proj[0])[:, 0]

    monkeypatch.setattr(kdspark.DSparkDraft, "confidence_logits", logits)


def confidence_gain_2pct(monkeypatch):
    """DSpark's confidence logits 2% too large (a gain a wrong scale would give): the [B] tap of 7 entries
    still sees it under the small-tap multiples (bands.small_tap)."""
    real = kdspark.DSparkDraft.confidence_logits
    monkeypatch.setattr(kdspark.DSparkDraft, "confidence_logits", lambda self, hn, prev: real(self, hn, prev) * 1.02)


DEFECTS = [
    # (defect, gate, the (r) line head that must fail)
    (wrong_eps, "qwen3-dflash", "(r) target layer"),
    (qk_norm_swapped, "qwen3-dflash", "(r) target layer"),
    (feature_layers_off_by_one, "qwen3-dflash", "(r) dflash"),
    (draft_mlp_gelu, "qwen3-dflash", "(r) dflash"),
    (markov_prev_off_by_one, "qwen3-dspark", "(r) dspark logits+markov"),
    # the verify / commit recurrence (the scan): seen by the state after the drafted windows
    (delta_rule_order, "qwen38-mtp", "(r) state after"),
    # the prefill's chunked form: seen by the per-layer lines over the prompt
    (prefill_decay_halved, "qwen38-mtp", "(r) target layer"),
    # the [B] confidence logits: 7 entries, checked with the small-tap multiples
    (confidence_bias_dropped, "qwen38-dspark", "(r) dspark confidence logits"),
    (confidence_gain_2pct, "qwen38-dspark", "(r) dspark confidence logits"),
]


@pytest.mark.parametrize(("defect", "name", "head"), DEFECTS, ids=[d[0].__name__ for d in DEFECTS])
def test_planted_defect_fails_in_bf16(monkeypatch, defect, name, head):
    defect(monkeypatch)
    code, lines = gate(name)
    assert code == 1 and failed(lines, head), "\n".join(lines)
