"""FAIL-first for gate qwen35moe-mtp on the trained fixture: the control passes, and each planted defect of the MoE
hybrid turns it red (exit 1) at the check that guards it: the shared-expert gate dropped, the router's
renormalisation dropped, the DeltaNet value heads read in llama.cpp's tiled order instead of HF's grouped one (the
V-head order a GGUF converter reorders), and the recurrent state not rolled back (both gates)."""

from __future__ import annotations

import pytest
import torch
from gate_run import failed, mtp_router_off, run_named

from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.kernels.families.qwen38 import model as kq38
from bloomery_gates.kernels.ops import gated_deltanet as kgd
from bloomery_gates.kernels.ops import moe as kmoe
from bloomery_gates.kernels.ops.gated_deltanet import l2norm

pytestmark = pytest.mark.skipif(not (FIXTURES / "qwen35moe-tiny").is_dir(), reason="fixtures/qwen35moe-tiny not built")


def gate(name: str = "qwen35moe-mtp", **kw):
    return run_named(name, **kw)




def test_control_passes():
    code, lines = gate()
    assert code == 0, "\n".join(lines)
    assert "ids identical 64" in lines
    assert sum(1 for line in lines if " chosen experts " in line and line.endswith(" PASS")) == 4
    routers = [line for line in lines if line.startswith("(r) mtp: draft routing of chained row ")]
    assert len(routers) == 3 and all(line.endswith(" PASS") for line in routers), "\n".join(lines)


def test_fail_first_the_mtp_router_off_bf16(monkeypatch):
    """The MTP layer's own router one expert off: its choice lines FAIL in bf16, no target line does."""
    mtp_router_off(monkeypatch)
    code, lines = gate(dtype="bf16")
    assert code == 1 and failed(lines, "(r) mtp: draft routing of chained row 0"), "\n".join(lines)
    assert not any(line.startswith("(r) target") and line.endswith(" FAIL") for line in lines), "\n".join(lines)


def test_fail_first_shared_expert_gate_dropped(monkeypatch):
    real = kmoe.shared_expert
    monkeypatch.setattr(kmoe, "shared_expert", lambda x, g, u, d, gate: real(x, g, u, d, None))
    code, lines = gate()
    assert code == 1 and failed(lines, "(r) target layer 0 out"), "\n".join(lines)


def test_fail_first_router_not_renormalised(monkeypatch):
    def unnormalised(logits, k):
        ids = kmoe.topk_stable(logits, k)
        return kmoe.Routing(ids, torch.softmax(logits, -1).gather(-1, ids), logits)

    monkeypatch.setattr(kmoe, "softmax_topk", unnormalised)
    code, lines = gate()
    assert code == 1 and failed(lines, "(r) target layer 0 out"), "\n".join(lines)


def test_fail_first_value_heads_in_tiled_order(monkeypatch):
    def tiled(q, k, nv):                       # value head j reads key head j % nk (llama.cpp's layout), not j // r
        rep = nv // q.shape[-2]
        return (l2norm(q).repeat(*([1] * (q.dim() - 2)), rep, 1) * q.shape[-1] ** -0.5,
                l2norm(k).repeat(*([1] * (k.dim() - 2)), rep, 1))

    monkeypatch.setattr(kgd, "prepare_qk", tiled)        # the torch prepare (CPU) looks it up per call
    code, lines = gate()
    assert code == 1 and failed(lines, "(r) target layer 0 out"), "\n".join(lines)


needs_dflash = pytest.mark.skipif(not (FIXTURES / "qwen35moe-tiny-dflash-b8").is_dir(), reason="no DFlash fixture")


@needs_dflash
def test_dflash_control_passes():
    code, lines = gate("qwen35moe-dflash")
    assert code == 0, "\n".join(lines)
    assert "ids identical 64" in lines


@pytest.mark.parametrize("name", ["qwen35moe-mtp", pytest.param("qwen35moe-dflash", marks=needs_dflash)])
def test_fail_first_state_not_rolled_back(monkeypatch, name):
    monkeypatch.setattr(kq38.Qwen38Target, "_rollback_row", lambda self, kept, first, n: n - 1)
    code, lines = gate(name)
    assert code == 1 and failed(lines, "(w) prompt"), "\n".join(lines)
