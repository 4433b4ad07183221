"""Result records: one JSON file per run, written atomically (temp file + rename)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from bloomery_gates.kernels.triton import pdl_policy


def git_commit() -> str:
    """The checkout's commit (``-dirty`` when tracked files changed); $BLOOMERY_COMMIT where there is no
    git checkout (a copied working tree on the device machine)."""
    if os.environ.get("BLOOMERY_COMMIT"):
        return os.environ["BLOOMERY_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=5, cwd=Path(__file__).resolve().parent).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"


# The environment settings that change how the engines run (not what they compute): a record made under one names
# it, and its rows stand apart in the tables (``side.device_label``)
KNOBS = ("BLOOMERY_PDL", "BLOOMERY_GEMV", "BLOOMERY_GEMV_CONFIGS")


def conditions(device: torch.device) -> dict[str, Any]:
    out = {
        "device_name": device_name(device), "commit": git_commit(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": torch.__version__, "python": platform.python_version(),
    }
    pdl = pdl_policy.describe(device)
    if pdl is not None:                         # what the graphed passes took (on by default since issue 27)
        out["pdl"] = pdl
    knobs = {k: os.environ[k] for k in KNOBS if os.environ.get(k)}
    if knobs:
        out["knobs"] = knobs
    return out


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary file in its folder (created when missing), renamed into place:
    never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)                      # mkstemp makes 0600; a record is for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, record: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(record, indent=2, sort_keys=False) + "\n")


def write_report(path: Path, facts: dict[str, Any], lines: list[str], device: torch.device) -> None:
    """A gate's JSON record: its facts, the run's conditions and its printed lines."""
    write_atomic(path, {**facts, "conditions": conditions(device), "lines": lines})
