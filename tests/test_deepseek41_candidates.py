"""deepseek41's two-level candidate mask (docs/V41.md 8): the op on the device against the float64 reference (name
for name: ``block_scores``, ``candidate_blocks``, ``candidate_mask``) on random scores with the newest block pinned,
fewer blocks than kept, -inf blocks and rows that see nothing; the reader's three keys and its named errors (exit
2); the engine's masked choices equal the reference's on the fixture and the mask bites there; a flip to or from a
non-finite score is never excused (``bands.routing_flip_excused``); and the FAIL-first plants in bf16 on the gate
``ds41-dspark`` (the newest block not pinned, the mask not applied): exit 1 with a failing (r) line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from bloomery_cli.bands import Band, routing_flip_excused
from bloomery_cli.families.deepseek41 import fixture_gguf as fx
from bloomery_cli.families.deepseek41.reader_gguf import deepseek41_from_gguf
from bloomery_gates.errors import EXIT_INPUT, BadConfig, InputError
from bloomery_gates.kernels.ops import v41_stream as ks
from bloomery_gates.reference.ops import v41_stream as rs
from bloomery_gates.spec import CandidateMask

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TARGET = FIXTURES / "ds41-tiny" / "ds41-tiny.gguf"
needs_fixture = pytest.mark.skipif(not (FIXTURES / "ds41-tiny-dspark-b7.gguf").is_file(),
                                   reason="fixtures/ds41-tiny*.gguf not built")
D = fx.STREAMS
SRC = "deepseek41.attention.candidate_"


# ---------------------------------------------------------------------------------------------- the op

def mask_both(scores: np.ndarray, lens: np.ndarray, bs: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(kernel, reference) masks [R, n] of the same scores [R, n] (float32 on the device, f64 on the host)."""
    n = scores.shape[1]
    kb = ks.candidate_blocks(ks.block_scores(torch.tensor(scores, dtype=torch.float32), torch.tensor(lens), bs), k)
    rb = rs.candidate_blocks(rs.block_scores(scores, lens, bs), k)
    assert kb.shape == rb.shape == (len(lens), k)
    return ks.candidate_mask(kb, n, bs).numpy(), rs.candidate_mask(rb, n, bs)


def hidden(scores: np.ndarray, lens: np.ndarray) -> np.ndarray:
    return np.where(np.arange(scores.shape[1])[None, :] < lens[:, None], scores, -np.inf)


@pytest.mark.parametrize("n,bs,k", [(11, 2, 3), (16, 4, 2), (7, 3, 5), (9, 1, 4), (5, 8, 2)])
def test_kernel_mask_equals_reference_on_random_scores(n, bs, k):
    """Random distinct scores, every row's visible count 0..n: the device's mask is the reference's, each row keeps
    min(k, blocks it sees) blocks, always the newest one's, nothing past what it sees is chosen from a -inf block."""
    g = np.random.default_rng(n * 100 + bs * 10 + k)
    lens = np.arange(n + 1)
    scores = hidden(g.permutation((n + 1) * n).reshape(n + 1, n).astype(np.float64), lens)
    got, want = mask_both(scores, lens, bs, k)
    assert (got == want).all()
    for t, m in enumerate(want):
        seen = -(-lens[t] // bs)
        kept = {i // bs for i in np.flatnonzero(m)}
        assert len(kept) == min(k, seen) and all(j < seen for j in kept)
        if lens[t]:
            assert (lens[t] - 1) // bs in kept


def test_mask_by_hand():
    """The definition on small rows: the newest block pinned over better full blocks, a kept partial block covers
    its whole width, -inf blocks dropped when fewer blocks are seen than kept, a row that sees nothing keeps
    nothing, equal block scores at the cut go to the lower block."""
    inf = np.inf
    cases = [  # scores, len, block size, blocks kept -> mask
        ([9.0, 8.0, 1.0, -inf], 3, 2, 1, [0, 0, 1, 1]),
        ([1.0, -inf, -inf, -inf], 1, 1, 4, [1, 0, 0, 0]),
        ([5.0, 0.0, 3.0, 4.0, 2.0, 1.0], 6, 2, 2, [1, 1, 0, 0, 1, 1]),
        ([-inf, -inf, -inf], 0, 1, 2, [0, 0, 0]),
        ([2.0, 2.0, 2.0, 0.5], 4, 1, 3, [1, 1, 0, 1]),
    ]
    for s, n, bs, k, want in cases:
        got, ref = mask_both(np.array([s]), np.array([n]), bs, k)
        assert ref[0].astype(int).tolist() == want and (got == ref).all(), (s, n, bs, k)


def test_mask_plant_fails_the_op_check():
    """FAIL-first for the op test: a mask without the newest block pinned differs from the reference's."""
    g = np.random.default_rng(7)
    lens = np.arange(1, 13)
    scores = hidden(g.standard_normal((12, 12)), lens)
    scores[np.arange(12), lens - 1] = -50.0                      # the newest entry scores lowest
    kb = ks.candidate_blocks(ks.block_scores(torch.tensor(scores).float(), torch.zeros(12, dtype=torch.long), 2), 2)
    want = rs.candidate_mask(rs.candidate_blocks(rs.block_scores(scores, lens, 2), 2), 12, 2)
    assert not (ks.candidate_mask(kb, 12, 2).numpy() == want).all()


def test_flip_to_a_non_finite_score_is_never_excused():
    """A row with an entry at -inf (not visible, or masked) gives no scale: a flip to a masked entry, or away from
    the pinned (+inf) block, is not excused; a flip inside the finite scores is judged on them."""
    band = Band(0.01, "test")
    c = np.array([5.0, 4.99, 1.0, -np.inf])
    assert routing_flip_excused(c, np.array([0]), np.array([1]), band)
    assert not routing_flip_excused(c, np.array([0]), np.array([2]), band)
    assert not routing_flip_excused(c, np.array([0]), np.array([3]), band)
    assert not routing_flip_excused(np.array([np.inf, 2.0, 1.9]), np.array([0, 1]), np.array([1, 2]), band)


# ---------------------------------------------------------------------------------------------- the reader

def plant(tmp_path: Path, keys: dict) -> Path:
    def edit(w):
        for k, v in keys.items():
            w.add_uint32(SRC + k, v)
    return fx.write_deepseek41_gguf(tmp_path / "plant.gguf", fx.tiny_tensors(D), D, edit_keys=edit)


def test_reader_reads_the_three_keys(tmp_path):
    spec = deepseek41_from_gguf(plant(tmp_path, {"source_layer_id": 1, "block_size": 2, "topk_blocks": 3}))
    assert spec.candidates == CandidateMask(1, 2, 3)
    assert [spec.masked(l) for l in range(5)] == [False, False, False, True, False]    # layer 4: ratio 1
    assert deepseek41_from_gguf(plant(tmp_path, {})).candidates is None


@pytest.mark.parametrize("keys,named", [
    ({"block_size": 2, "topk_blocks": 3}, "candidate_source_layer_id: missing"),
    ({"source_layer_id": 2, "block_size": 2, "topk_blocks": 3}, "must be an index source"),
    ({"source_layer_id": 0, "block_size": 2, "topk_blocks": 3}, "must be an index source"),
    ({"source_layer_id": 7, "block_size": 2, "topk_blocks": 3}, "the file has 5 layers"),
    ({"source_layer_id": 1, "block_size": 0, "topk_blocks": 3}, "candidate_block_size"),
    ({"source_layer_id": 1, "block_size": 1, "topk_blocks": 3}, "fewer than attention.indexer.top_k 4"),
    ({"source_layer_id": 1, "block_size": 2, "topk_blocks": 0}, "candidate_topk_blocks")])
def test_reader_refuses_bad_candidate_keys_by_name(tmp_path, keys, named):
    with pytest.raises(BadConfig, match=named) as e:
        deepseek41_from_gguf(plant(tmp_path, keys))
    assert isinstance(e.value, InputError) and EXIT_INPUT == 2 and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------- the fixture

@needs_fixture
def test_fixture_mask_bites_and_engine_choices_equal_the_reference():
    """On the fixture (source 1, blocks of 2, 3 kept) at 64 tokens the f32 engine's choices and kept blocks are the
    reference's, and the mask changes most of layer 3's choices against the same file without it."""
    from bloomery_gates.kernels.families.deepseek41.model import Deepseek41Target
    from bloomery_gates.reference.families.deepseek41 import model as ref
    from bloomery_gates.reference.ops.moe import pinned

    spec = deepseek41_from_gguf(TARGET)
    assert spec.candidates == CandidateMask(1, 2, 3)
    ids = [int(i) for i in np.random.default_rng(0).integers(0, spec.vocab_size, 64)]
    got = Deepseek41Target(spec, "cpu", torch.float32, 64).prefill(ids).choices
    with pinned({}, layered=True) as pin:
        ref.forward(spec, ids)
    named = {kind: own for (kind, _), (_, own) in pin.seen.items() if kind in got}
    assert set(named) == {"stream choice of layer 1", "stream choice of layer 3", "stream choice of layer 4",
                          "candidate blocks of layer 1"}
    for key, own in named.items():
        assert (got[key].numpy() == own).all(), key
    plain = Deepseek41Target(replace(spec, candidates=None), "cpu", torch.float32, 64).prefill(ids).choices
    a, b = got["stream choice of layer 3"].numpy(), plain["stream choice of layer 3"].numpy()
    changed = sum(set(a[t]) != set(b[t]) for t in range(64))
    assert changed >= 32, changed


def gate_lines(tmp_path: Path, argv: list[str] | None = None) -> tuple[int, list[str]]:
    from typer.testing import CliRunner

    from bloomery_cli.cli import app

    first = (FIXTURES / "prompts.jsonl").read_text().splitlines()[0]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"ids": json.loads(first)["ids"]}) + "\n")
    args = ["gate", "run", "ds41-dspark", "-n", "8", "--prompts", str(prompts), "--dtype", "bf16", *(argv or [])]
    r = CliRunner().invoke(app, args)
    return r.exit_code, r.output.splitlines()


@needs_fixture
def test_gate_refuses_a_bad_mask_exit_2(tmp_path):
    """A target whose mask keeps fewer rows than the indexer's top-k: exit 2, the key named, no traceback."""
    from tokenizers import Tokenizer

    from bloomery_cli.families.deepseek41.fixture import dims

    spec = deepseek41_from_gguf(TARGET)
    tok = Tokenizer.from_file(str(FIXTURES / "tokenizer.json"))
    d = replace(dims(spec.vocab_size), candidates=(1, 1, 2))
    bad = fx.write_deepseek41_gguf(tmp_path / "bad.gguf", dict(spec.tensors.items()), d, tok=tok)
    code, lines = gate_lines(tmp_path, ["--target", str(bad)])
    out = "\n".join(lines)
    assert code == 2 and "candidate_topk_blocks" in out and "Traceback" not in out, out


def unpinned(monkeypatch) -> None:
    """The engine's block scores without the newest visible entry's block pinned."""
    real = ks.block_scores
    monkeypatch.setattr(ks, "block_scores", lambda s, lens, bs: real(s, torch.zeros_like(lens), bs))


def unmasked(monkeypatch) -> None:
    """The engine's later index sources choose over every entry (the mask not applied)."""
    monkeypatch.setattr(ks, "candidate_mask", lambda b, n, bs: torch.ones(b.shape[0], n, dtype=torch.bool))


@needs_fixture
def test_gate_passes_with_the_mask_bf16(tmp_path):
    code, lines = gate_lines(tmp_path)
    rows = [x for x in lines if x.startswith("(r)") and ("candidate blocks" in x or "layer 3" in x)]
    assert code == 0 and rows and all(x.endswith("PASS") for x in rows), "\n".join(lines)


@needs_fixture
@pytest.mark.parametrize("plant,line", [(unpinned, "candidate blocks of layer 1"),
                                        (unmasked, "stream choice of layer 3")], ids=["unpinned", "unmasked"])
def test_fail_first_gate_exits_1_bf16(tmp_path, monkeypatch, plant, line):
    plant(monkeypatch)
    code, lines = gate_lines(tmp_path)
    assert code == 1, "\n".join(lines)
    assert any(x.startswith("(r)") and line in x and x.endswith("FAIL") for x in lines), "\n".join(lines)
