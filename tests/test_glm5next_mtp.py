"""The glm5next (GLM-5.3) NextN layer and the glm5next-mtp gate: the device draft against the f64 reference (drafted
rows, chained rows, the store after a rollback), the reader's named refusals, and the gate on the trained fixture
with planted defects in bf16 (FAIL-first: each must turn a NextN line red and the gate exit 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gate_run import failed, run_named
from glm5next_factory import V, write

from bloomery_cli.bands import worst_rel
from bloomery_cli.families.glm5next.reader import glm5next_from_hf
from bloomery_cli.families.glm5next.reader_mtp import glm5next_nextn_from_file
from bloomery_gates.errors import BadTensor, Mismatch, Refused
from bloomery_gates.gates.fixtures import FIXTURES
from bloomery_gates.kernels.families.glm5next import mtp as kmtp
from bloomery_gates.kernels.families.glm5next.model import Glm5NextTarget
from bloomery_gates.kernels.ops import mhc as kmhc
from bloomery_gates.kernels.ops.norm import rms_norm
from bloomery_gates.reference.families.glm5next import model as rmodel
from bloomery_gates.reference.families.glm5next import mtp as rmtp

FIXTURE = (FIXTURES / "glm5next-tiny").is_dir()
needs_fixture = pytest.mark.skipif(not FIXTURE, reason="fixtures/glm5next-tiny not built "
                                   "(python -m bloomery_cli.families.glm5next.fixture --out fixtures)")


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    return glm5next_from_hf(write(tmp_path_factory.mktemp("glm5next") / "m", nextn=1))


def ids_of(n: int, seed: int = 1) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(0, V, n)]


def drafted(spec, ids):
    eng = Glm5NextTarget(spec, "cpu", torch.float32, max_len=64, rows=4)
    p = eng.prefill(ids)
    d = kmtp.Glm5NextNDraft(spec, eng, 64)
    d.prompt(p.taps)
    return eng, p, d, rmodel.final_norm(spec, p.taps[-1].double().numpy())


def test_draft_matches_reference(spec):
    """The 3 drafted rows (the real anchor row, 2 chained rows reading g and the chained rows' latent / keys):
    layer out and logits within f32 chain rounding of the f64 reference, the same ids; the indexer selects (14 keys
    at the anchor, top-4 tokens)."""
    ids = ids_of(14)
    _, p, d, final = drafted(spec, ids)
    got = d.propose(p.argmax[-1], detail=True)
    ref = rmtp.draft(spec, ids, final, p.argmax[-1], 3, chain_ids=got.ids)
    assert worst_rel(got.logits.double().numpy(), ref.logits) < 1e-5
    assert worst_rel(got.layer_out[0].double().numpy(), ref.layer_out) < 1e-5
    assert got.ids == [int(i) for i in ref.ids]
    assert spec.dsa.topk < len(ids)


def _keep_chained(monkeypatch):
    """The rollback planted away: propose also counts its chained rows as written for good."""
    propose = kmtp.Glm5NextNDraft.propose

    def keep(self, anchor, detail=False):
        out = propose(self, anchor, detail)
        self.next_slot += self.width - 1
        return out
    monkeypatch.setattr(kmtp.Glm5NextNDraft, "propose", keep)


@pytest.mark.parametrize("plant", [None, "chained rows kept"])
def test_store_after_a_reject_is_the_real_rows(spec, plant, monkeypatch):
    """Propose (3 chained rows written past the real ones), a verify that keeps 2 rows, propose again: the store's
    real rows are the reference's rows over the committed ids + the anchor, the chained rows gone. FAIL-first: with
    the chained rows kept as real the comparison fails."""
    if plant:
        _keep_chained(monkeypatch)
    ids = ids_of(20)
    eng, p, d, _ = drafted(spec, ids[:12])
    prop = d.propose(p.argmax[-1])
    v = eng.verify([p.argmax[-1], *prop.ids])
    eng.commit(2)
    d.accept(2, v.taps)
    anchor = v.argmax[1]
    d.propose(anchor)
    seq = ids[:12] + [p.argmax[-1], prop.ids[0], anchor]
    final = rmodel.forward(spec, seq[:-1]).final
    lat, a = rmtp.store_rows(spec, seq, final)
    got_lat, got_a = d.store_rows()
    ok = got_lat.shape[0] == len(seq) - 1 and worst_rel(got_lat.double().numpy(), lat) < 1e-5 and worst_rel(
        got_a.double().numpy(), a) < 1e-5
    assert ok == (plant is None)


def test_reference_sees_the_mean_and_the_norm(spec):
    """The reference's drafts move when the hidden is pre-norm or stream 0 (the plants below have a target)."""
    ids = ids_of(14)
    _, p, _, final = drafted(spec, ids)
    last = p.taps[-1].double().numpy()
    base = rmtp.draft(spec, ids, final, p.argmax[-1], 1).logits
    for wrong in (last.mean(1), rmodel.final_norm(spec, last[:, :1])):
        assert worst_rel(rmtp.draft(spec, ids, wrong, p.argmax[-1], 1).logits, base) > 1e-3


def test_reader_refuses_no_nextn_and_mhc_in_the_block(tmp_path):
    d0 = write(tmp_path / "none")
    with pytest.raises(Mismatch, match="num_nextn_predict_layers"):
        glm5next_nextn_from_file(d0, glm5next_from_hf(d0))

    def plant(p):
        p["model.layers.4.attn_hc.fn"] = torch.zeros(24, 256)

    d1 = write(tmp_path / "hc", nextn=1, edit=plant)
    with pytest.raises(Refused, match="no mHC"):
        glm5next_nextn_from_file(d1, glm5next_from_hf(d1))

    d2 = write(tmp_path / "short", nextn=1, edit=lambda p: p.pop("model.layers.4.self_attn.indexer.wk.weight"))
    with pytest.raises(BadTensor, match="indexer.wk"):
        glm5next_nextn_from_file(d2, glm5next_from_hf(d2))


# ------------------------------------------------------------------------------------------------ the gate


def gate(**kw):
    return run_named("glm5next-mtp", 64, 8, **kw)


@needs_fixture
def test_gate_control_passes_bf16():
    code, lines = gate(dtype="bf16")
    assert code == 0, "\n".join(lines)
    assert "ids identical 64" in lines and any(line.startswith("(r) nextn row 3 logits") for line in lines)
    assert any(line.startswith("(r) nextn indexer chained row 3 chosen tokens") for line in lines)
    routers = [line for line in lines if line.startswith("(r) nextn: draft routing of chained row ")]
    assert len(routers) == 3 and all(line.endswith("PASS") for line in routers), "\n".join(lines)


def _pre_norm(self, taps):
    return kmhc.mhc_head(taps[-1])


def _stream0(self, taps):
    return rms_norm(taps[-1][:, 0], self.final_gain, self.eps).to(self.dtype)


def _no_tail(monkeypatch):
    init = kmtp.Glm5NextNDraft.__init__

    def without(self, *a, **k):
        init(self, *a, **k)
        self.select_tail = False
    monkeypatch.setattr(kmtp.Glm5NextNDraft, "__init__", without)


def _router_off(monkeypatch):
    from dataclasses import replace

    real = kmtp.route
    monkeypatch.setattr(kmtp, "route", lambda moe, t, m, x: (lambda r: replace(
        r, ids=(r.ids + 1) % moe.num_experts))(real(moe, t, m, x)))


PLANTS = {
    # the NextN fed the streams' mean before model.norm (pre-norm) instead of the head's post-norm row
    "pre-norm hidden": ("(r) nextn row 1", lambda mp: mp.setattr(kmtp.Glm5NextNDraft, "target_rows", _pre_norm)),
    # the NextN fed stream 0 (normed) instead of the mean of the 4 streams: 2.5e-2 from the mean on this fixture,
    # inside the drafted rows' bf16 bands; the line on the rows it reads (two ops deep) sees it
    "stream 0 instead of the mean": ("(r) nextn hidden in",
                                     lambda mp: mp.setattr(kmtp.Glm5NextNDraft, "target_rows", _stream0)),
    # the DSA tail rule dropped in the NextN's indexer only (the trunk's keeps it): a row no longer sees its own
    # incomplete pool (itself included); the chosen tokens differ from the rule's
    "NextN tail rule dropped": ("(r) nextn indexer", _no_tail),
    # the NextN's own router one expert off for every row (ids + 1 mod E, weights kept): its choice lines
    # (routing_flips, the kernel's experts against the f64 group-limited rule) say FAIL
    "NextN router off": ("(r) nextn: draft routing of chained row 0", _router_off),
}


@needs_fixture
@pytest.mark.parametrize("plant", list(PLANTS))
def test_gate_fails_bf16(monkeypatch, plant):
    """Planted in the NextN draft, run in bf16: the line it breaks says FAIL, the gate exits 1, and no target line
    fails (the defect is the draft's)."""
    head, plant_it = PLANTS[plant]
    plant_it(monkeypatch)
    code, lines = gate(dtype="bf16")
    assert code == 1 and failed(lines, head), "\n".join(lines)
    assert not any(line.startswith("(r) target") and line.endswith(" FAIL") for line in lines), "\n".join(lines)
