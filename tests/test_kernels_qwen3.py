"""The device engine agrees with its own differentiable forward, pass by pass (f32, CPU)."""

from __future__ import annotations

import torch

from bloomery_gates.kernels.drafts.dflash import DFlashDraft
from bloomery_gates.kernels.drafts.dflash import forward_train as dflash_train
from bloomery_gates.kernels.families.qwen3.model import Qwen3Target, forward_train


def test_prefill_verify_match_full_forward(tiny_target):
    ids = torch.randint(0, 101, (1, 20), generator=torch.Generator().manual_seed(3))
    logits, hidden = forward_train(tiny_target.tensors, tiny_target, ids)
    eng = Qwen3Target(tiny_target, "cpu", torch.float32, max_len=64, rows=4)
    p = eng.prefill(ids[0, :12].tolist(), logits=True)
    torch.testing.assert_close(p.logits, logits[0, :12], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(p.taps, torch.stack([h[0, :12] for h in hidden]), atol=1e-5, rtol=1e-5)
    v = eng.verify(ids[0, 12:15].tolist(), logits=True)
    torch.testing.assert_close(v.logits, logits[0, 12:15], atol=1e-5, rtol=1e-5)
    eng.commit(2)                              # keep rows 12, 13; row 14 is re-run below
    v = eng.verify(ids[0, 14:18].tolist(), logits=True)
    torch.testing.assert_close(v.logits, logits[0, 14:18], atol=1e-5, rtol=1e-5)


def test_dflash_engine_matches_train_forward(tiny_target, tiny_dflash):
    ids = torch.randint(0, 100, (1, 24), generator=torch.Generator().manual_seed(4))
    _, hidden = forward_train(tiny_target.tensors, tiny_target, ids)
    anchors = torch.tensor([[5, 9, 16]])
    ref = dflash_train(tiny_dflash.tensors, tiny_dflash, tiny_target.tensors, tiny_target, hidden, ids, anchors)
    eng = Qwen3Target(tiny_target, "cpu", torch.float32, max_len=64)
    draft = DFlashDraft(tiny_dflash, eng, max_len=64)
    taps = torch.stack([h[0] for h in hidden])
    for a, s in enumerate(anchors[0].tolist()):
        draft.ctx_len = 0
        draft.prompt(taps[:, :s])
        got = draft.propose(int(ids[0, s]), detail=True)
        torch.testing.assert_close(got.logits, ref[0, a], atol=1e-5, rtol=1e-5)
