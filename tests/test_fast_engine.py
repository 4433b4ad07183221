"""``--engine fast`` (bloomery_cli/fast_engine.py): the gate's lines on the engines ``bloomery bench`` measures.

On a CPU the fast engines run their torch path (``kernels.graphs.TorchOps``, no CUDA graphs): the load line says
so, and every supported pair passes in f32 and bf16. FAIL-first: a causal limit off by one in the fast path's
torch attention (row r of a pass sees the key at position p0 + r + 1) exits 1 on the fast gate in f32 and bf16,
while the eager gate, which does not run that code, still passes. Pairs without a fast engine and flags the fast
engines do not take are one named line, exit 2, before any work.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from gate_run import failed, run_named
from typer.testing import CliRunner

from bloomery_cli.cli import app
from bloomery_cli.fast_engine import why_not
from bloomery_gates.gates import GATES
from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.kernels import graphs as kgraphs
from bloomery_gates.kernels.families.qwen38 import fast as kq38f

pytestmark = pytest.mark.skipif(not (FIXTURES / "qwen3-tiny").is_dir(), reason="fixtures/ not built")

FAST = ("qwen3-dflash", "qwen3yarn-dflash", "qwen38-mtp", "qwen38-dflash2")


def gate(name: str, dtype: str, engine: str = "fast"):
    return run_named(name, 32, 1, dtype=dtype, engine=engine)


def test_the_supported_pairs():
    """The bench's pairs (qwen3-dflash, qwen38-mtp, qwen38-dflash2) and qwen3yarn-dflash (qwen3-dflash's classes with
    yarn RoPE tables); sliding-window DFlash layers have no fast draft."""
    assert sorted(n for n, g in GATES.items() if why_not(g) is None) == sorted(FAST)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", FAST)
def test_fast_gate_passes_on_its_torch_path(name, dtype):
    code, lines = gate(name, dtype)
    assert code == 0, "\n".join(lines)
    load = next(line for line in lines if line.startswith("load "))
    assert "engine=fast ops=torch graphs=off" in load, load
    assert any(line.startswith("(r) state after") for line in lines), "\n".join(lines)
    assert any(line.startswith("ids identical 32") for line in lines)


def qwen3_causal_off_by_one(monkeypatch):
    """FastQwen3Target's torch attention (``kernels.graphs.attention``, copied with one change): a causal row r
    sees keys <= p0 + r + 1."""
    def planted(qkv, nq, nkv, d, kc, vc, p0, causal=True, gate=None):
        r, g = qkv.shape[0], nq // nkv
        pos = p0 + torch.arange(r, device=qkv.device)
        lim = pos + 1 if causal else (p0 + r - 1).expand(r)                               # planted: + 1
        allowed = torch.arange(kc.shape[1], device=qkv.device)[None, :] <= lim[:, None]
        bias = torch.zeros(allowed.shape, dtype=qkv.dtype, device=qkv.device).masked_fill(~allowed, float("-inf"))
        q = qkv[:, : nq * d].reshape(r, nkv, g, d).permute(1, 2, 0, 3).reshape(1, nkv, g * r, d)
        o = F.scaled_dot_product_attention(q, kc[None], vc[None], attn_mask=bias.repeat(g, 1)[None, None],
                                           scale=1.0 / math.sqrt(d))
        o = o.view(nkv, g, r, d).permute(2, 0, 1, 3).reshape(r, nq * d)
        return o if gate is None else kgraphs.sigmoid_gate(o, gate)

    monkeypatch.setattr(kgraphs.TorchOps, "attention", staticmethod(planted))


def qwen38_causal_off_by_one(monkeypatch):
    """FastQwen38Target's torch attention (the masked matmul of ``gated_attention``): allowed keys <= pos + 1."""
    real = kq38f.gated_attention

    def planted(ops, shape, h, w, kc, vc, pos, p0, allowed, *rest):
        return real(ops, shape, h, w, kc, vc, pos, p0, allowed | F.pad(allowed[:, :-1], (1, 0)), *rest)

    monkeypatch.setattr(kq38f, "gated_attention", planted)


PLANTS = [("qwen3-dflash", qwen3_causal_off_by_one), ("qwen38-mtp", qwen38_causal_off_by_one)]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name,plant", PLANTS)
def test_fail_first_causal_limit_off_by_one(monkeypatch, name, plant, dtype):
    plant(monkeypatch)
    code, lines = gate(name, dtype)
    assert code == 1, "\n".join(lines)
    assert failed(lines, "(r) target layer"), "\n".join(lines)
    code, lines = gate(name, dtype, engine="ours")            # the eager engine does not run the planted code
    assert code == 0, "\n".join(lines)


runner = CliRunner()


@pytest.mark.parametrize("name", sorted(set(GATES) - set(FAST)))
def test_unsupported_pair_is_one_line_exit_2(name, tmp_path):
    out = tmp_path / "r.json"
    r = runner.invoke(app, ["gate", "run", name, "--engine", "fast", "--json", str(out)], catch_exceptions=False)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "--engine fast" in r.output and name in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    assert not out.exists()


def test_a_sliding_window_draft_is_one_line_exit_2():
    swa = FIXTURES / "qwen3-tiny-dflash-b8-swa"
    r = runner.invoke(app, ["gate", "run", "qwen3-dflash", "--engine", "fast", "--draft", str(swa)],
                      catch_exceptions=False)
    assert r.exit_code == 2, r.output
    assert "sliding-window" in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


@pytest.mark.parametrize("flag", [["--tp", "2"], ["--draft-device", "cpu"], ["--temperature", "1"]])
def test_flags_the_fast_engine_does_not_take(flag):
    r = runner.invoke(app, ["gate", "run", "qwen3-dflash", "--engine", "fast", *flag], catch_exceptions=False)
    assert r.exit_code == 2, r.output
    assert flag[0] in r.output and "Traceback" not in r.output, r.output
