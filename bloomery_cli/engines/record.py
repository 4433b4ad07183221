"""The engine-agnostic record: what any engine's greedy runs must say for the gate to judge them (docs/ENGINES.md).

JSONL. Line 1, the header:
    {"schema": "bloomery.engine-record/1", "engine": str, "gate": str, "dtype": "f32"|"bf16"|"f16",
     "device": str, "n": int, "width": int (the most ids a window may propose), "acceptance": str (the engine's own
     acceptance figure and its definition), "settings": {...} (free: how the engine was run)}
Then one line a prompt:
    {"prompt": int, "prompt_ids": [int], "plain_ids": [int] (n greedy ids, draft off),
     "drafted_ids": [int] (n greedy ids, draft on),
     "windows": [{"proposed": int, "accepted": int, "emitted": int, "draft_ids": [int]}, ...]  (the drafted run's
         verify passes in order: ids proposed, how many the verification kept, ids the window emitted (accepted + 1,
         or more where the engine re-verified a kept prefix), the proposed ids; draft_ids may be [] when the engine
         does not expose them: the draft-ids line then reports that it could not run and fails),
     "counters": {...} (the engine's own totals, free)}
Reading it checks every field before any work (exit 2 with the line and field named).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bloomery_gates.errors import BadConfig

from ..files import parse_json, read_text
from ..results.records import write_text_atomic

SCHEMA = "bloomery.engine-record/1"
WHAT = "engine record"


@dataclass
class Window:
    proposed: int
    accepted: int
    emitted: int
    draft_ids: list[int] = field(default_factory=list)


@dataclass
class PromptRun:
    prompt: int
    prompt_ids: list[int]
    plain_ids: list[int]
    drafted_ids: list[int]
    windows: list[Window]
    counters: dict[str, Any] = field(default_factory=dict)


@dataclass
class Header:
    engine: str
    gate: str
    dtype: str
    device: str
    n: int
    width: int
    acceptance: str
    settings: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA


@dataclass
class Record:
    header: Header
    prompts: list[PromptRun]


def write(record: Record, path: Path) -> None:
    """Written to a temporary file, then renamed (records.write_text_atomic): never a half-written record."""
    lines = [json.dumps(asdict(record.header))] + [json.dumps(asdict(p)) for p in record.prompts]
    write_text_atomic(path, "\n".join(lines) + "\n")      # --results DIR is created only when one is written


def _ints(obj: dict, key: str, where: str, vocab: int | None = None) -> list[int]:
    v = obj.get(key)
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise BadConfig(where, f"{key!r} must be a list of non-negative integers")
    if vocab is not None and any(x >= vocab for x in v):
        raise BadConfig(where, f"{key!r} holds an id >= the target's vocab size {vocab}")
    return v


def _int(obj: dict, key: str, where: str, low: int = 0) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise BadConfig(where, f"{key!r} must be an integer >= {low}")
    return v


def read(path: Path, vocab: int | None = None) -> Record:
    lines = [x for x in read_text(path, WHAT).splitlines() if x.strip()]
    if len(lines) < 2:
        raise BadConfig(path, "expected a header line and one line per prompt")
    head = parse_json(lines[0], f"{path}:1", "header")
    if not isinstance(head, dict) or head.get("schema") != SCHEMA:
        raise BadConfig(f"{path}:1", f"expected a header with \"schema\": \"{SCHEMA}\"")
    for key in ("engine", "gate", "dtype", "device", "acceptance"):
        if not isinstance(head.get(key), str):
            raise BadConfig(f"{path}:1", f"header {key!r} must be a string")
    if head["dtype"] not in ("f32", "bf16", "f16"):
        raise BadConfig(f"{path}:1", f"dtype {head['dtype']!r}; expected f32, bf16 or f16")
    header = Header(head["engine"], head["gate"], head["dtype"], head["device"], _int(head, "n", f"{path}:1", 2),
                    _int(head, "width", f"{path}:1", 1), head["acceptance"], dict(head.get("settings") or {}))
    prompts = []
    for i, line in enumerate(lines[1:], 2):
        where = f"{path}:{i}"
        obj = parse_json(line, where, "prompt line")
        if not isinstance(obj, dict):
            raise BadConfig(where, "expected a JSON object")
        ids = {k: _ints(obj, k, where, vocab) for k in ("prompt_ids", "plain_ids", "drafted_ids")}
        if not ids["prompt_ids"]:
            raise BadConfig(where, "'prompt_ids' is empty")
        wins = obj.get("windows")
        if not isinstance(wins, list):
            raise BadConfig(where, "'windows' must be a list")
        windows = []
        for j, w in enumerate(wins):
            at = f"{where} windows[{j}]"
            if not isinstance(w, dict):
                raise BadConfig(at, "expected an object")
            win = Window(_int(w, "proposed", at), _int(w, "accepted", at), _int(w, "emitted", at, 1),
                         _ints(w, "draft_ids", at, vocab) if "draft_ids" in w else [])
            if win.accepted > win.proposed or win.proposed > header.width:
                raise BadConfig(at, f"accepted {win.accepted} > proposed {win.proposed}, or proposed > width "
                                    f"{header.width}")
            windows.append(win)
        prompts.append(PromptRun(_int(obj, "prompt", where), ids["prompt_ids"], ids["plain_ids"],
                                 ids["drafted_ids"], windows, dict(obj.get("counters") or {})))
    return Record(header, prompts)


def own_record(gate: str, dtype: str, device: str, n: int, width: int, runs: list) -> Record:
    """Our own engine's greedy runs as a record (``bloomery gate run NAME --record PATH``): runs = per prompt
    (prompt ids, plain Run, drafted Run) from ``speculative.generate``; windows are its verify passes, after the
    prefill's own id."""
    prompts = []
    for i, (ids, plain, drafted) in enumerate(runs):
        # the prefill emits the first id (no verify pass): a window of 0 proposals, 1 id, so that positions align
        wins = [Window(0, 0, 1)] + [Window(len(prop), kept - 1, kept, list(prop)) for prop, kept in drafted.windows]
        prompts.append(PromptRun(i, list(ids), list(plain.ids), list(drafted.ids), wins))
    return Record(Header("bloomery (ours: eager torch engine)", gate, dtype, device, n, width,
                         "ours: accept_mean = mean kept rows per window, the bonus included (docs/CONTRACT.md)"),
                  prompts)
