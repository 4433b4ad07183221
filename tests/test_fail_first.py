"""FAIL-first (CONTRACT.md): each planted defect turns the qwen3-dflash gate red on the trained fixtures.

Each test plants one defect with monkeypatch, runs the real gate (fewer ids and prompts to stay quick),
and asserts exit 1 and which check caught it. A control run without a defect passes.
"""

from __future__ import annotations

import pytest
import torch
from gate_run import failed, run_named

import bloomery_cli.speculative as speculative
from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.kernels.drafts import dflash as kdflash
from bloomery_gates.kernels.families.qwen3.model import Qwen3Target

pytestmark = pytest.mark.skipif(not (FIXTURES / "qwen3-tiny").is_dir(), reason="fixtures/ not built")


def gate(name: str = "qwen3-dflash", **kw):
    return run_named(name, **kw)




def test_control_passes():
    code, lines = gate()
    assert code == 0, "\n".join(lines)
    assert "ids identical 64" in lines


def test_target_layer_ids_shifted_by_one(monkeypatch):
    real = kdflash.context_features

    def shifted(taps, layer_ids, *args):
        return real(taps, [l - 1 for l in layer_ids], *args)

    monkeypatch.setattr(kdflash, "context_features", shifted)
    code, lines = gate()
    assert code == 1 and failed(lines, "(r) dflash logits"), "\n".join(lines)


def test_bonus_token_dropped(monkeypatch):
    monkeypatch.setattr(speculative, "emitted_ids", lambda argmax, kept: argmax[: max(kept - 1, 1)])
    code, lines = gate()
    assert code == 1 and failed(lines, "(w) prompt"), "\n".join(lines)
    assert not any(line.startswith("ids identical") for line in lines)


def test_kv_not_cut_on_commit(monkeypatch):
    verify = Qwen3Target.verify

    def remember(self, ids, logits=False):
        self._rows = len(ids)
        return verify(self, ids, logits)

    def commit_all(self, kept):
        self.length += getattr(self, "_rows", kept)    # the defect: every verified row stays, kept or not

    monkeypatch.setattr(Qwen3Target, "verify", remember)
    monkeypatch.setattr(Qwen3Target, "commit", commit_all)
    code, lines = gate()
    assert code == 1 and failed(lines, "(w) prompt"), "\n".join(lines)


def test_causal_mask_inside_the_block(monkeypatch):
    def causal(self, s):
        ctx = (self.key_pos < s)[None, :].expand(self.b, -1)
        tri = torch.tril(torch.ones(self.b, self.b, dtype=torch.bool, device=self.device))
        return torch.cat([ctx, tri], dim=1)

    monkeypatch.setattr(kdflash.DFlashDraft, "block_allowed", causal)
    code, lines = gate()
    assert code == 1 and failed(lines, "(r) dflash"), "\n".join(lines)
