"""Two results/<device>/README.md sections built from the gate records alone:

* greedy and T = 1 side by side: one row per gate x device x dtype (every gate and every device/dtype pair that
  some quality record has), the latest greedy record's accept_mean, the latest T = 1 record's accept_mean and its
  (s) verdict and p, the published T = 1 figures for the drafter kind (ANCHORS.md, external), and both records;
  ``-`` where no such record exists;
* random-weight real-layout runs (``is_random_layout``): real checkpoint layouts filled with random weights
  (``fixturegen/real_layout.py``) measure memory and time, not model quality; their acceptance is 1.0 by
  construction, so they are listed apart from the acceptance tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

Record = tuple[Path, dict[str, Any]]
RANDOM_WORDS = ("random", "real-layout", "real_layout")
RANDOM_WHY = ("Real checkpoint layouts at real sizes filled with random weights (`python -m "
              "bloomery_cli.fixturegen.real_layout`, `.ci/device-real.sh`; [h200/real/NOTE.md](h200/real/NOTE.md)): "
              "they measure host and device memory and wall time at a real model's size, not drafting quality. With "
              "random weights the draft's proposals are unrelated to the target's greedy ids, so none is accepted: "
              "accept_mean is 1.0 (the bonus row of each window only) and the gate fails on its `(b)` line alone "
              "(both branches: nothing kept), honestly. They are kept out of the acceptance tables above.")


def sampling_label(r: dict[str, Any]) -> str:
    """greedy, or the record's sampling conditions (T, top-p, top-k, the drafter's q)."""
    s = r.get("sampling")
    if not s:
        return "greedy"
    extra = (f" top-p {s['top_p']:g}" if s.get("top_p", 1) < 1 else "") + (f" top-k {s['top_k']}" if s.get("top_k")
                                                                           else "")
    q = f", q {s['q']}" if s.get("q") and s["q"] != "point mass" else ""
    return f"T={s['temperature']:g}{extra}{q}"


def random_why(records: list[Record]) -> str:
    """RANDOM_WHY with its NOTE.md link relative to the folder the records are relative to (the ``real`` folder of
    the first random record under one), or without the link where none is."""
    for path, r in records:
        parts = Path(path).parts[:-1]
        if "gate" in r and "real" in parts:
            note = Path(*parts[:parts.index("real") + 1], "NOTE.md").as_posix()
            return RANDOM_WHY.replace("h200/real/NOTE.md", note)
    return RANDOM_WHY.replace("; [h200/real/NOTE.md](h200/real/NOTE.md)", "")


def is_random_layout(path: Path, r: dict[str, Any]) -> bool:
    """A random-weight real-layout run: its record lies under a ``real`` folder of results/, or its conditions (or
    its target's name) say random / real-layout."""
    if "real" in Path(path).parts[:-1]:
        return True
    c = r.get("conditions") or {}
    words = " ".join(str(v) for v in c.values()) + " " + str(r.get("weights", ""))
    return any(w in words.lower() for w in RANDOM_WORDS)


def quality_records(records: list[Record]) -> list[Record]:
    """Gate records with acceptance that measure model quality (random real-layout runs left out)."""
    return [(p, r) for p, r in records if "gate" in r and r.get("acceptance") and not is_random_layout(p, r)]


def device_label(r: dict[str, Any]) -> str:
    """The device a record ran on, and where its draft ran when on a device of its own (``--draft-device``), its
    target over several processes (``--tp``) or another engine ran the pair (``--engine``): such runs get rows of
    their own in every table."""
    name = str((r.get("conditions") or {}).get("device_name", r.get("device", "?")))
    load = r.get("load") or {}
    if load.get("draft_device") and load["draft_device"] != r.get("device"):
        name += f" (draft on {load['draft_device']})"
    if int(load.get("tp", 1) or 1) > 1:
        name += f" (tp {load['tp']})"
    if load.get("engine"):                       # another engine under the gate (bloomery_cli.engines)
        name += f" (engine {load['engine']})"
    knobs = (r.get("conditions") or {}).get("knobs") or {}
    if knobs:                                    # an engine setting of the environment (records.KNOBS)
        name += " (" + ", ".join(f"{k}={v}" for k, v in sorted(knobs.items())) + ")"
    return name



def _date(r: dict[str, Any]) -> str:
    return str((r.get("conditions") or {}).get("date", ""))


def _f(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, int | float) and not isinstance(x, bool) else "-"


def _link(path: Path | None, prefix: str) -> str:
    return "-" if path is None else f"[{path.name}]({prefix}{path.as_posix()})"


def _is_t1(r: dict[str, Any]) -> bool:
    s = r.get("sampling") or {}
    return bool(s) and float(s.get("temperature", 0)) == 1.0


def _s_line(r: dict[str, Any]) -> str:
    """The (s) verdict and p of a sampled record ("-" when it has no (s) line)."""
    line = next((c for c in r.get("checks", []) if str(c.get("line", "")).startswith("(s)")), None)
    p = (r.get("sampling_test") or {}).get("p")
    if line is None and p is None:
        return "-"
    verdict = "-" if line is None else ("PASS" if line.get("ok") else "FAIL")
    return f"{verdict}, p={p:.3g}" if isinstance(p, float) else verdict


def _target(r: dict[str, Any]) -> str:
    return Path(str(r.get("target", "?"))).name


def _latest(recs: list[Record], target: str | None) -> Record | None:
    """The latest of ``recs``, among those of ``target`` when some are (the T = 1 run's target beside its greedy)."""
    same = [x for x in recs if target is not None and _target(x[1]) == target]
    pool = same or recs
    return max(pool, key=lambda x: _date(x[1])) if pool else None


def newest_per_gate(records: list[Record]) -> dict[str, list[Record]]:
    """The quality records (``quality_records``: random real-layout runs left out) with a kept-length histogram, the
    newest per (gate, engine, dtype, sampling), grouped by gate in name order: one panel a gate of the histogram
    plot. Every record of a pair reports the same windows when nothing changed, so older ones add bars, not
    information; another engine (``--engine llama.cpp``) and the graphed engine (``fast``) keep bars of their own."""
    newest: dict[tuple[str, str, str, str], Record] = {}
    for path, r in quality_records(records):
        if not r["acceptance"].get("kept"):
            continue
        key = (r["gate"], str((r.get("load") or {}).get("engine") or ""), str(r.get("dtype", "")), sampling_label(r))
        if key not in newest or _date(newest[key][1]) <= _date(r):
            newest[key] = (Path(path), r)
    out: dict[str, list[Record]] = {}
    for key, run in sorted(newest.items()):
        out.setdefault(key[0], []).append(run)
    return out


def side_by_side_rows(records: list[Record], published: dict[str, str], prefix: str = "") -> list[list[str]]:
    """[gate, device, dtype, target, greedy accept_mean, T=1 accept_mean, (s), published T=1, greedy record,
    T=1 record] per gate x (device, dtype) seen in the quality records."""
    greedy: dict[tuple[str, str, str], list[Record]] = {}
    t1: dict[tuple[str, str, str], Record] = {}
    kinds: dict[str, str] = {}
    for path, r in quality_records(records):
        key = (r["gate"], device_label(r), str(r.get("dtype", "?")))
        kinds.setdefault(r["gate"], str((r.get("load") or {}).get("draft", "?")))
        if not r.get("sampling"):
            greedy.setdefault(key, []).append((path, r))
        elif _is_t1(r) and (key not in t1 or _date(t1[key][1]) <= _date(r)):
            t1[key] = (path, r)
    gates = sorted({k[0] for k in (*greedy, *t1)})
    combos = sorted({k[1:] for k in (*greedy, *t1)})
    rows = []
    for gate in gates:
        for device, dtype in combos:
            s = t1.get((gate, device, dtype))
            g = _latest(greedy.get((gate, device, dtype), []), _target(s[1]) if s else None)
            targets = sorted({_target(x[1]) for x in (g, s) if x is not None})
            rows.append([gate, device, dtype, ", ".join(targets) or "-",
                         _f(g[1]["acceptance"].get("accept_mean")) if g else "-",
                         _f(s[1]["acceptance"].get("accept_mean")) if s else "-",
                         _s_line(s[1]) if s else "-", published.get(kinds.get(gate, ""), "-"),
                         _link(g[0] if g else None, prefix), _link(s[0] if s else None, prefix)])
    return rows


SIDE_HEAD = ["gate", "device", "dtype", "target", "accept_mean greedy", "accept_mean T=1", "(s) verdict, p",
             "published at T = 1 (external)", "greedy record", "T=1 record"]


def random_rows(records: list[Record], prefix: str = "") -> list[list[str]]:
    rows = []
    for path, r in records:
        if "gate" not in r or not r.get("acceptance") or not is_random_layout(path, r):
            continue
        failed = [c["line"].split(":")[0] for c in r.get("checks", []) if not c.get("ok")]
        rows.append([r["gate"], str(r.get("target", "?")), str(r.get("draft", "?")),
                     _f(r["acceptance"].get("accept_mean")), f"{r.get('n', '?')} x {r.get('prompts', '?')}",
                     device_label(r), str(r.get("dtype", "?")), "PASSED" if r.get("passed") else "FAILED",
                     "; ".join(failed) or "-", str((r.get("conditions") or {}).get("commit", "?")),
                     _link(path, prefix)])
    return rows


RANDOM_HEAD = ["gate", "target (random weights)", "draft (random weights)", "accept_mean", "N (ids x prompts)",
               "device", "dtype", "verdict", "failed checks", "commit", "record"]
