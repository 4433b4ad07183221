"""Running a registered gate inside a test: its exit code and printed lines, and whether a line failed."""

from __future__ import annotations

from bloomery_cli.gate import GateOptions, run_gate
from bloomery_gates.gates import GATES


def run_named(name: str, n: int = 64, prompts: int = 2, **options) -> tuple[int, list[str]]:
    """``bloomery gate run NAME -n n`` on the first ``prompts`` fixture prompts (``GateOptions`` fields in
    ``options``), in process: (exit code, the contract lines)."""
    lines: list[str] = []
    code, _ = run_gate(GATES[name], GateOptions(n=n, max_prompts=prompts, **options), emit=lines.append)
    return code, lines


def failed(lines: list[str], head: str) -> bool:
    """Some line starting with ``head`` ended in FAIL."""
    return any(line.startswith(head) and line.endswith(" FAIL") for line in lines)


def mtp_router_off(monkeypatch) -> None:
    """Plant: the MoE FFN of an ``mtp.*`` layer (kernels.families.ffn: qwen35moe's and qwen4exp's MTP) sends every
    row to the experts next to the ones its router ranked (ids + 1 mod E, weights kept); the target's layers are
    untouched."""
    from dataclasses import replace

    from bloomery_gates.kernels.families import ffn

    real = ffn.route

    def planted(moe, t, m, x):
        r = real(moe, t, m, x)
        return replace(r, ids=(r.ids + 1) % moe.num_experts) if m.startswith("mtp.") else r

    monkeypatch.setattr(ffn, "route", planted)
