"""What a gate definition (bloomery_gates.gates) is written with, below the runner (``bloomery_cli.gate``) that runs
it: ``GateDef`` (what a (target family, drafter) pair brings), ``DraftCheck`` (what its draft checks get), and the
run dtypes and device parsing the runner, the benches and the probes share. The gates import this, never the
runner (tests/test_layers.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.dtypes import TORCH
from bloomery_gates.errors import InputError
from bloomery_gates.kernels.triton import pdl_policy

OWN_ENGINES = ("ours", "fast")      # the engines this harness builds (the gate pipeline runs them); others: engines/
DTYPES = TORCH          # run dtype name -> torch dtype (bloomery_gates.dtypes, the one table)


@dataclass(frozen=True)
class GateOption:
    """An option a gate declares (``GateDef.options``): its default, the help of the flag the CLI makes of it
    (``--name-with-dashes``) and how the flag's text becomes its value (``parse`` raises ValueError saying what
    was expected; the CLI turns that into exit 2 naming the flag). Gates that declare the same name share one
    GateOption."""

    default: Any
    help: str
    parse: Callable[[str], Any]
    metavar: str = "VALUE"

    def value(self, flag: str, text: str) -> Any:
        try:
            return self.parse(text)
        except ValueError as e:
            raise InputError(flag, f"{text!r}: {e}") from None


def unit_interval(text: str) -> float:
    """A threshold in [0, 1]."""
    try:
        x = float(text)
    except ValueError:
        raise ValueError("expected a number in [0, 1]") from None
    if not 0.0 <= x <= 1.0:
        raise ValueError("expected a threshold in [0, 1] (0 disables)")
    return x


def one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected {' or '.join(choices)}")
        return text
    return parse


@dataclass(frozen=True)
class GateDef:
    """What a (target, drafter) pair brings; the runner does the rest."""

    name: str
    family: str
    draft_kind: str
    target: Path
    draft: Path
    prompts: Path
    about: str
    load_draft: Callable[[Path, Any], Any]                 # (path, target spec) -> draft spec
    make_draft: Callable[[Any, Any, int], Any]             # (draft spec, target engine, max_len) -> Draft
    block: Callable[[Any], int]                            # draft spec -> verify rows per pass
    describe: Callable[[Any], dict[str, Any]]              # draft spec -> load-line facts
    check_draft: Callable[..., None]                       # (report, DraftCheck) -> (r) lines
    n: int = 256
    anchors: tuple[str, ...] = ()                          # published numbers, printed as external
    check_draft_oracle: Callable[..., None] | None = None  # (report, DraftCheck, plain ids) -> (o) lines
    options: dict[str, GateOption] = field(default_factory=dict)   # its own flags (the CLI makes them)
    draft_state: tuple = ()                                # StateDecls: the draft's store after a run (state_check)
    own_ids: int = 0                                       # ids its own checks generate (engines are sized for them)
    make_fast_draft: Callable[..., Any] | None = None      # make_draft on the family's fast_engine (--engine fast)


@dataclass
class DraftCheck:
    """What a draft's (r) checks get: both specs, the engines, the prompt, the target's taps."""

    target_spec: Any
    draft_spec: Any
    engine: Any
    draft: Any
    prompt: list[int]
    prefill: Any        # the engine's Pass over the prompt
    ref: Any            # the target reference's RefOut over the prompt
    dtype: str


def resolve_device(device: str) -> torch.device:
    pdl_policy.setting()                # a bad BLOOMERY_PDL is a named error before any work (exit 2)
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InputError("--device", f"{device} asked for, but CUDA is not available on this machine")
        return torch.device(device)
    if device != "cpu":
        raise InputError("--device", f"{device!r}: expected cpu, cuda or cuda:<i>")
    return torch.device("cpu")
