"""Every family's and every drafter's float64 reference on the bundled fixtures, as named calls.

``calls(pkg)`` builds the calls against the reference package ``pkg`` (``bloomery_gates.reference``, or the
pre-namespace code of an older commit imported under another name, ``old_reference``), each fed HOST inputs as the
harness feeds them (the reference's own host taps standing in for the kernel's), so that one call run inside
``reference.xp.run`` exercises the way in (weights and inputs onto the device) and the way out (``to_host``).
``flat`` turns any result into {path: numpy array} for exact or 1e-12 comparisons.
"""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from bloomery_cli.loading import load_target
from bloomery_gates.gates import GATES

REPO = Path(__file__).resolve().parent.parent
MOVED = ("spec", "lru", "errors")      # bloomery_cli -> bloomery_gates since the baseline (the core)
BASELINE = "e2e6325"          # the last commit before reference/ took its array namespace (issue 16)
IDS = [(37 * i + 11) % 211 + 5 for i in range(20)]


@cache
def specs(gate: str) -> tuple[Any, Any]:
    """(target spec, draft spec) of a registered gate's default fixtures (loaded once per test session)."""
    g = GATES[gate]
    target = load_target(g.target)
    return target, g.load_draft(g.draft, target)


def old_reference(tmp: Path, commit: str = BASELINE) -> str | None:
    """reference/ at ``commit`` extracted under ``tmp`` and importable as a package; its name, or None when the
    checkout has no git history for it (a tarball)."""
    name = f"ref_{commit}"
    if name in sys.modules:
        return name
    out = tmp / name
    try:
        blob = subprocess.run(["git", "-C", str(REPO), "archive", commit, "reference"], check=True,
                              capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(tmp, filter="data")
    (tmp / "reference").rename(out)
    for f in out.rglob("*.py"):           # the core it imported has moved (issue 24): the same code, a new name
        text = f.read_text()
        for mod in MOVED:
            text = text.replace(f"bloomery_cli.{mod}", f"bloomery_gates.{mod}")
        f.write_text(text)
    sys.path.insert(0, str(tmp))
    return name


def flat(obj: Any, path: str = "") -> dict[str, np.ndarray]:
    """{path: array} over arrays, numbers, dataclasses, tuples, lists and dicts (None and strings dropped)."""
    if isinstance(obj, (np.ndarray, np.generic, int, float, bool)):
        return {path: np.asarray(obj)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = dataclasses.fields(obj)
        return {k: v for f in fields for k, v in flat(getattr(obj, f.name), f"{path}.{f.name}").items()}
    if isinstance(obj, (tuple, list)):
        return {k: v for i, x in enumerate(obj) for k, v in flat(x, f"{path}[{i}]").items()}
    if isinstance(obj, dict):
        return {k: v for key, x in obj.items() for k, v in flat(x, f"{path}[{key!r}]").items()}
    if obj is None or isinstance(obj, str):
        return {}
    raise TypeError(f"{path}: cannot flatten a {type(obj).__name__} (a device array outside reference.xp.run?)")


def calls(pkg: str) -> dict[str, Callable[[], Any]]:
    """name -> a call of the reference package ``pkg`` on fixture weights and host inputs."""
    def m(name: str, before: str | None = None):
        """The module ``name`` of ``pkg``; ``before``: its name in the flat layout before the family folders
        (issue 24), which the pre-namespace snapshot (e2e6325) still has."""
        try:
            return importlib.import_module(f"{pkg}.{name}")
        except ModuleNotFoundError:
            if before is None:
                raise
            return importlib.import_module(f"{pkg}.{before}")

    q3, q38 = m("families.qwen3.model", "families.qwen3"), m("families.qwen38.model", "families.qwen38")
    mimo2, q35 = m("families.mimo2.model", "families.mimo2"), m("families.qwen35moe.model", "families.qwen35moe")
    dflash, dflash2, dspark, eagle3 = m("drafts.dflash"), m("drafts.dflash2"), m("drafts.dspark"), m("drafts.eagle3")
    mtp, mmtp, attn = m("drafts.mtp"), m("families.mimo2.mtp", "drafts.mimo2_mtp"), m("ops.attention")
    as_f64 = m("weights").as_f64
    t = len(IDS)
    out: dict[str, Callable[[], Any]] = {}

    t3, d3 = specs("qwen3-dflash")
    h3 = q3.forward(t3, IDS)             # host taps, as the harness holds the kernel's
    out["qwen3 forward"] = lambda: q3.forward(t3, IDS)
    out["qwen3 layer 1"] = lambda: q3.decoder_layer(t3.layer, as_f64(t3), "model.layers.1.", h3.hidden[1],
                                                    np.arange(t), attn.causal_mask(t))
    out["qwen3 head"] = lambda: q3.head(t3, h3.final)
    out["qwen3 kv rows"] = lambda: q3.kv_rows(t3, h3, t - 3)
    out["dflash forward"] = lambda: dflash.forward(d3, t3, h3, IDS[-1])
    out["dflash context kv"] = lambda: dflash.context_kv(d3, h3, t)
    for gate in ("qwen3-dflash-swa", "qwen3-dflash-swa-spec"):
        _, dswa = specs(gate)
        out[f"{gate} forward"] = lambda d=dswa: dflash.forward(d, t3, h3, IDS[-1], s=t - 2)
    _, d2 = specs("qwen3-dflash2")
    out["dflash2 forward"] = lambda: dflash2.forward(d2, t3, h3, IDS[-1])
    _, ds = specs("qwen3-dspark")
    out["dspark forward"] = lambda: dspark.forward(ds, t3, h3, IDS[-1])
    out["dspark forward, teacher-forced"] = lambda: dspark.forward(ds, t3, h3, IDS[-1],
                                                                   prev=[IDS[-1], *IDS[:ds.block_size - 1]])
    _, e3 = specs("qwen3-eagle3")
    out["eagle3 draft"] = lambda: eagle3.draft(e3, t3, IDS[:-1], h3.hidden, IDS[-1], 3)
    ty, dy = specs("qwen3yarn-dflash")
    hy = q3.forward(ty, IDS)
    out["qwen3 yarn forward"] = lambda: q3.forward(ty, IDS)
    out["qwen3 yarn dflash forward"] = lambda: dflash.forward(dy, ty, hy, IDS[-1])

    t8, m8 = specs("qwen38-mtp")
    h8 = q38.forward(t8, IDS)
    out["qwen38 forward"] = lambda: q38.forward(t8, IDS)
    for l in range(t8.num_layers):
        out[f"qwen38 layer {l}"] = lambda l=l: q38.reference_layer(t8, l, h8.hidden[l])
    out["qwen38 kv rows"] = lambda: q38.kv_rows(t8, h8, t - 3)
    out["qwen38 recurrent state"] = lambda: q38.recurrent_state(t8, h8, t - 3)
    out["qwen38 mtp teacher-forced"] = lambda: mtp.teacher_forced(m8, t8, IDS, h8.final)
    out["qwen38 mtp draft"] = lambda: mtp.draft(m8, t8, IDS[:-1], h8.final[:-1], IDS[-1], 3)
    out["qwen38 mtp store rows"] = lambda: mtp.store_rows(m8, t8, IDS, h8.final)
    for gate, run in (("qwen38-dflash", dflash.forward), ("qwen38-dflash2", dflash2.forward),
                      ("qwen38-dspark", dspark.forward)):
        _, d = specs(gate)
        out[f"{gate} forward"] = lambda d=d, run=run: run(d, t8, h8, IDS[-1])

    tm, mm = specs("qwen35moe-mtp")
    hm = q35.forward(tm, IDS)
    out["qwen35moe forward"] = lambda: q35.forward(tm, IDS)
    out["qwen35moe layer 0"] = lambda: q35.reference_layer(tm, 0, hm.hidden[0])
    out["qwen35moe mtp draft"] = lambda: mtp.draft(mm, tm, IDS[:-1], hm.final[:-1], IDS[-1], 2)
    _, dm = specs("qwen35moe-dflash")
    out["qwen35moe-dflash forward"] = lambda: dflash.forward(dm, tm, hm, IDS[-1])

    tx, mx = specs("mimo2-mtp")
    hx = mimo2.forward(tx, IDS)
    out["mimo2 forward"] = lambda: mimo2.forward(tx, IDS)
    for l in range(tx.num_layers):
        out[f"mimo2 layer {l}"] = lambda l=l: mimo2.reference_layer(tx, l, hx.hidden[l])
    out["mimo2 kv rows"] = lambda: mimo2.kv_rows(tx, hx, t - 3)
    out["mimo2 mtp draft"] = lambda: mmtp.draft(mx, tx, IDS[:-1], hx.final[:-1], IDS[-1], "post")
    out["mimo2 mtp chain pre"] = lambda: mmtp.chain(mx, tx, IDS, hx.hidden[-1], "pre")
    out["mimo2 mtp store rows"] = lambda: mmtp.store_rows(mx, tx, IDS, hx.final, "post")
    return out
