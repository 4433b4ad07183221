"""Issue 29 part 1: speculative sampling checked exactly. The kernel's sampled runs replayed by the host rule on the
same uniforms (``sampling_replay``) must emit the same ids window by window; each planted sampling defect (residual
not renormalised, bonus from the draft's distribution, bonus from the last draft row's p) exits 1 on the replay line,
in f32 and bf16, on qwen3-dflash (T = 1, with and without a draft temperature) and qwen38-mtp. The (s) statistical
line is shrunk to 4 runs per arm here (``shrink_s``): these tests assert the replay line."""

from __future__ import annotations

import numpy as np
import pytest
from issue29_plants import SAMPLING_PLANTS, gate_run, line, shrink_s

from bloomery_cli.sampling import replay as sampling_replay
from bloomery_cli.sampling.exact import Table, ToyDraft, ToyTarget
from bloomery_cli.sampling.rule import Sampling, process
from bloomery_gates.gates.fixtures import FIXTURES, PROMPTS

CONFIGS = {"qwen3-dflash T=1": ("qwen3-dflash", ["--temperature", "1"]),
           "qwen3-dflash T=1 Td=0.7": ("qwen3-dflash", ["--temperature", "1", "--draft-temperature", "0.7"]),
           "qwen38-mtp T=1": ("qwen38-mtp", ["--temperature", "1"])}
REPLAY = "(s) sampling replay"
built = pytest.mark.skipif(not (FIXTURES / "qwen3-tiny").is_dir(), reason="fixtures/ not built")


@pytest.fixture(scope="module")
def one_prompt(tmp_path_factory):
    path = tmp_path_factory.mktemp("i29") / "one.jsonl"
    path.write_text(PROMPTS.read_text().splitlines()[0] + "\n")
    return path


@built
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_clean_replay_passes(config, dtype, one_prompt, monkeypatch):
    shrink_s(monkeypatch)
    gate, flags = CONFIGS[config]
    code, lines = gate_run(gate, one_prompt, dtype, *flags)
    got = line(lines, REPLAY)
    assert code == 0 and got.endswith(" PASS") and " 0 runs differ" in got, "\n".join(lines)


@built
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("plant", list(SAMPLING_PLANTS))
def test_planted_sampling_defect_fails_the_replay(plant, config, dtype, one_prompt, monkeypatch):
    shrink_s(monkeypatch)
    SAMPLING_PLANTS[plant](monkeypatch)
    gate, flags = CONFIGS[config]
    code, lines = gate_run(gate, one_prompt, dtype, *flags)
    assert code == 1 and line(lines, REPLAY).endswith(" FAIL"), "\n".join(lines)


# --- the host transcription on its own ---

@pytest.mark.parametrize("t, k, p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.9, 7, 0.6)])
def test_host_probs_equals_process(t, k, p):
    rng = np.random.default_rng(0)
    logits = np.round(rng.normal(0, 2, (6, 40)), 1)         # rounded: ties in the top-k / top-p walk
    for row in logits:
        assert np.allclose(sampling_replay.host_probs(row, t, k, p), process(row[None], t, k, p)[0],
                           rtol=0, atol=1e-15)


def toy_replay(cond: Sampling, kind: str = "block", runs: int = 12, n: int = 10):
    """The replay on the exact proof's toy target and draft (vocab 5, blocks of 3): (runs, windows, differ)."""
    target = ToyTarget(Table(5, 0))
    draft = ToyDraft(target, Table(5, 1), kind, 3)
    res = sampling_replay.check_replay(target, draft, [[1, 2], [3, 0, 4]] * (runs // 2), n, cond, None, 3)
    return res


@pytest.mark.parametrize("cond", [Sampling(1.0), Sampling(0.8, top_k=3), Sampling(1.0, draft_temperature=0.6)])
def test_toy_replay_is_exact(cond):
    res = toy_replay(cond)
    assert res.runs == 24 and res.windows > 100 and res.differ == 0, res


@pytest.mark.parametrize("plant", list(SAMPLING_PLANTS))
@pytest.mark.parametrize("cond", [Sampling(1.0), Sampling(1.0, draft_temperature=0.6)])
def test_toy_replay_sees_each_plant(plant, cond, monkeypatch):
    SAMPLING_PLANTS[plant](monkeypatch)
    res = toy_replay(cond)
    assert res.differ > res.excused, res


def test_a_draw_out_of_order_is_seen(monkeypatch):
    """The stated order: accept u before the residual's u. Drawing the residual first breaks the replay."""
    import bloomery_cli.sampling.rule as sampling

    def window(self, logits, proposals, q_rows):
        p_rows = self.probs(logits)
        out = []
        for j, d in enumerate(proposals):
            x = self.choose(sampling.residual(p_rows[j], q_rows[j], d))       # drawn before the accept u
            a = sampling.accept_prob(p_rows[j], q_rows[j], d)
            if self.choose(np.array([1.0 - a, a])) == 1:
                out.append(d)
                continue
            out.append(x)
            return j + 1, out
        out.append(self.choose(p_rows[len(proposals)]))
        return len(proposals) + 1, out

    monkeypatch.setattr(sampling.Sampler, "window", window)
    res = toy_replay(Sampling(1.0))
    assert res.differ > 0, res
