"""FAIL-first for the yarn-RoPE and sliding-window gates (qwen3yarn-dflash, qwen3-dflash-swa): each planted
defect turns the gate red, in f32 and, for the emulated bands, in bf16, on the bundled fixtures.

Kernel-only defects must be caught by the (r) lines (kernel vs our float64 reference). A defect planted in the
kernels and the reference together (what tier 2 cannot see) must be caught by the (o) lines: transformers'
own yarn code for the target, transformers' sliding-window mask function for the window rule.
"""

from __future__ import annotations

import numpy as np
import pytest
from gate_run import failed

from bloomery_cli.gate import GateOptions, run_gate
from bloomery_gates.gates import GATES
from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.kernels.drafts import dflash as kdflash
from bloomery_gates.kernels.ops import rope as krope
from bloomery_gates.reference.drafts import dflash as rdflash
from bloomery_gates.reference.ops import rope as rrope

pytestmark = pytest.mark.skipif(not (FIXTURES / "qwen3yarn-tiny").is_dir() or
                                not (FIXTURES / "qwen3-tiny-dflash-b8-swa").is_dir(), reason="fixtures/ not built")
YARN, SWA = "qwen3yarn-dflash", "qwen3-dflash-swa"


def gate(name: str, dtype: str = "f32", oracle: bool = False):
    lines: list[str] = []
    n, prompts = (64, 2) if dtype == "f32" else (32, 1)
    code, _ = run_gate(GATES[name], GateOptions(n=n, max_prompts=prompts, dtype=dtype, oracle=oracle),
                       emit=lines.append)
    return code, lines




def no_attention_factor(monkeypatch, module) -> None:
    """yarn's cos/sin multiplier dropped (q . k loses its a^2)."""
    monkeypatch.setattr(module, "attention_factor", lambda scaling: 1.0)


def window_one_wider(monkeypatch, module, name) -> None:
    """The window off by one: p - W <= j <= p (W + 1 keys)."""
    monkeypatch.setattr(module, name, lambda q, k, w: (k[None, :] <= q[:, None]) & (k[None, :] >= q[:, None] - w))


def window_ignored(monkeypatch) -> None:
    """Every layer full attention, the spec's windows not read."""
    monkeypatch.setattr(kdflash.DFlashDraft, "layer_masks",
                        lambda self, s: [self.block_allowed(s)] * self.spec.num_layers)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", [YARN, SWA, "qwen3-dflash-swa-spec"])
def test_control_passes(name, dtype):
    code, lines = gate(name, dtype)
    assert code == 0, "\n".join(lines)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_kernel_yarn_attention_factor_dropped(monkeypatch, dtype):
    no_attention_factor(monkeypatch, krope)
    code, lines = gate(YARN, dtype)
    assert code == 1 and failed(lines, "(r) target layer 0 out"), "\n".join(lines)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_kernel_window_off_by_one(monkeypatch, dtype):
    window_one_wider(monkeypatch, kdflash, "sliding_mask")
    code, lines = gate(SWA, dtype)
    assert code == 1 and failed(lines, "(r) dflash"), "\n".join(lines)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_kernel_window_ignored(monkeypatch, dtype):
    window_ignored(monkeypatch)
    code, lines = gate(SWA, dtype)
    assert code == 1 and failed(lines, "(r) dflash"), "\n".join(lines)


def test_yarn_attention_factor_dropped_everywhere_caught_by_transformers(monkeypatch):
    pytest.importorskip("transformers")
    no_attention_factor(monkeypatch, krope)
    no_attention_factor(monkeypatch, rrope)
    code, lines = gate(YARN, oracle=True)
    assert not any(line.startswith("(r)") and line.endswith(" FAIL") for line in lines), "\n".join(lines)
    assert code == 1 and failed(lines, "(o) host f64 logits vs transformers"), "\n".join(lines)


def test_window_off_by_one_everywhere_caught_by_transformers(monkeypatch):
    pytest.importorskip("transformers")
    window_one_wider(monkeypatch, kdflash, "sliding_mask")
    window_one_wider(monkeypatch, rdflash, "sliding_mask")
    code, lines = gate(SWA, oracle=True)
    assert not any(line.startswith("(r)") and line.endswith(" FAIL") for line in lines), "\n".join(lines)
    assert code == 1 and failed(lines, "(o) kernel dflash layer 0 window 16 mask"), "\n".join(lines)
    assert failed(lines, "(o) host f64 dflash layer 0 window 16 mask"), "\n".join(lines)


SPEC = "qwen3-dflash-swa-spec"


def anchored_one_wider(monkeypatch, module, name) -> None:
    """speculators' window off by one: s - W - 1 <= j (W + 1 context rows)."""
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda q, k, s, w, causal: real(q, k, s, w + 1, causal))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_kernel_speculators_window_off_by_one(monkeypatch, dtype):
    anchored_one_wider(monkeypatch, kdflash, "anchored_mask")
    code, lines = gate(SPEC, dtype)
    assert code == 1 and failed(lines, "(r) dflash"), "\n".join(lines)


def test_speculators_window_ignored_everywhere_caught_by_speculators(monkeypatch):
    pytest.importorskip("speculators")
    pytest.importorskip("transformers")
    window_ignored(monkeypatch)
    monkeypatch.setattr(rdflash, "window_mask", lambda d, q, k, s, w: np.ones((len(q), len(k)), dtype=bool))
    code, lines = gate(SPEC, oracle=True)
    assert not any(line.startswith("(r)") and line.endswith(" FAIL") for line in lines), "\n".join(lines)
    assert code == 1 and failed(lines, "(o) host f64 dflash logits"), "\n".join(lines)


def test_bidirectional_speculators_window_agrees_with_speculators(tmp_path):
    """sliding_window_non_causal true (the whole block, W context rows): our reference and kernel against
    speculators' own model with the same keys."""
    pytest.importorskip("speculators")
    import json
    import shutil

    draft = tmp_path / "bidir"
    shutil.copytree(FIXTURES / "qwen3-tiny-dflash-b8-swa-speculators", draft)
    cfg = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**cfg, "sliding_window_non_causal": True}))
    lines: list[str] = []
    code, _ = run_gate(GATES[SPEC], GateOptions(draft=draft, n=32, max_prompts=1, oracle=True), emit=lines.append)
    assert code == 0, "\n".join(lines)
    assert any("window_rule=anchor-bidir" in line for line in lines), "\n".join(lines)
    assert any(line.startswith("(o) kernel dflash logits") and line.endswith(" PASS") for line in lines)
