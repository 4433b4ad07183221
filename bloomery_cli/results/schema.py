"""The records ``bloomery results`` tabulates, checked before anything is written.

A record is one JSON object per ``*.json`` file under the results folder, read through ``files.read_json_file``
(size cap, UTF-8, nesting). ``SCHEMA`` gives, for every key the tables, plots and README blocks read, the JSON
type it must have where it is present (``num``: an int or float, never a bool; ``[T]``: a list of T; a dict: an
object whose listed keys are checked the same way; ``"*"``: every key of it). A bench record's ``checks`` is an
object of booleans (``BENCH``). Keys not listed are free; a listed key may be absent (the
tables print ``-``). The first failure names the file and the key path: ``<file>: key 'acceptance.accept_mean':
expected a number, got str``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bloomery_gates.errors import InputError

from ..files import read_json_file

NUM, INT, STR, BOOL, ANY = "num", "int", "str", "bool", "any"
_OPT = "?"                                   # suffix: null allowed

_ACCEPTANCE = {"accept_mean": NUM, "accept_mean_macro": NUM, "windows": INT, "kept": [INT], "pos_accept": [NUM],
               "pos_accept_cond": [NUM], "draft_share": NUM, "verify_rows": INT}
_CONDITIONS = {"device_name": STR, "date": STR, "commit": STR, "dtype": STR, "device": STR, "prompt_len": INT,
               "engine": STR, "verify_rows": INT, "layers": INT, "width": STR, "n": INT, "knobs": {"*": STR},
               "pdl": STR}
SCHEMA: dict[str, Any] = {
    "gate": STR, "bench": STR, "passed": BOOL, "complete": BOOL, "dtype": STR, "device": STR, "target": STR,
    "n": INT, "ctx": INT, "within": BOOL, "plan_measure": STR, "measured_what": STR, "prompt_len": INT,
    "lines": [STR], "checks": [{"line": STR, "ok": BOOL, "margin": NUM}],
    "acceptance": _ACCEPTANCE, "acceptance_greedy": _ACCEPTANCE, "conditions": _CONDITIONS,
    "sampling": {"temperature": NUM, "top_p": NUM, "top_k": INT, "seed": INT, "q": STR,
                 "draft_temperature": NUM + _OPT, "draft_top_k": INT},
    "sampling_test": {"p": NUM, "p_marginal": NUM, "p_pit_hist": NUM, "p_pit_mean": NUM, "alpha": NUM,
                      "runs": INT, "positions": INT, "test": STR},
    "load": {"draft": STR, "resident": INT, "target_resident": INT, "block": INT, "draft_device": STR},
    "plain": {"tok_s": NUM, "ratio_roofline": NUM, "ratio_roofline_read": NUM, "ids": [INT]},
    "bandwidth": {"copy_GBps": NUM, "roofline_tok_s": NUM, "roofline_read_tok_s": NUM},
    "weights": {"bytes": INT, "read_per_step": INT, "draft_bytes": INT},
    "sweep": [{"a": NUM, "accept_mean": NUM, "draft_share": NUM, "ids_identical": BOOL, "speedup": NUM,
               "tau_nominal": NUM, "tau_x_plain_frac": NUM, "frac_of_tau_x_plain": NUM, "tok_s": NUM,
               "tok_s_windows": NUM,
               "windows": INT, "q": ANY}],
    "verify": [{"ms": NUM, "rel_plain": NUM, "rows": INT}],
    "cost_policy": [{"a": NUM, "tok_s": NUM, "ids_identical": BOOL, "most_chosen": INT, "widths": [ANY]}],
    "criterion": {"accept_mean": NUM, "draft_share": NUM, "needed": NUM, "tok_s": NUM, "tok_s_windows": NUM,
                  "met": BOOL, "at": STR},
    "hf": {"tok_s": NUM, "ratio_ours": NUM, "tokens": INT, "error": STR},
    "bound": {"rows": INT, "frac_max": NUM, "attainable": BOOL},
}
# a bench record (its "bench" key, no "gate") names its self-checks: an object of booleans (``bloomery bench moe``),
# not a gate's check lines
BENCH: dict[str, Any] = {**SCHEMA, "checks": {"*": BOOL}}


def _name(value: Any) -> str:
    return "null" if value is None else {"dict": "object", "list": "array"}.get(type(value).__name__,
                                                                                   type(value).__name__)


def _check(value: Any, spec: Any, where: str) -> str | None:
    """None when ``value`` fits ``spec``, else what is wrong at ``where``."""
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"key '{where}': expected an object, got {_name(value)}"
        if "*" in spec:                                      # every value of the object
            spec = {**{k: spec["*"] for k in value}, **{k: v for k, v in spec.items() if k != "*"}}
        for key, sub in spec.items():
            if key in value:
                bad = _check(value[key], sub, f"{where}.{key}" if where else key)
                if bad:
                    return bad
        return None
    if isinstance(spec, list):
        if not isinstance(value, list):
            return f"key '{where}': expected an array, got {_name(value)}"
        for i, item in enumerate(value):
            bad = _check(item, spec[0], f"{where}[{i}]")
            if bad:
                return bad
        return None
    kind = spec.rstrip(_OPT)
    if value is None and spec.endswith(_OPT) or kind == ANY:
        return None
    ok = {NUM: isinstance(value, int | float) and not isinstance(value, bool),
          INT: isinstance(value, int) and not isinstance(value, bool),
          STR: isinstance(value, str), BOOL: isinstance(value, bool)}[kind]
    if ok:
        return None
    want = {NUM: "a number", INT: "an integer", STR: "a string", BOOL: "true or false"}[kind]
    return f"key '{where}': expected {want}, got {_name(value)}"


def check_record(path: Path | str, record: Any) -> dict[str, Any]:
    """``record`` if it is an object that fits ``SCHEMA``; else an ``InputError`` naming ``path`` and the key."""
    if not isinstance(record, dict):
        raise InputError(path, f"expected a results record (a JSON object), got {_name(record)}")
    bad = _check(record, BENCH if "bench" in record and "gate" not in record else SCHEMA, "")
    if bad:
        raise InputError(path, bad)
    return record


def load_checked(results_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every ``*.json`` record under ``results_dir`` read and checked: (path relative to the folder, record).
    Any bad record raises (its file named, and how many others are bad): nothing is skipped silently."""
    out, errors = [], []
    for path in sorted(Path(results_dir).rglob("*.json")):
        try:
            out.append((path.relative_to(results_dir), check_record(path, read_json_file(path, "results record"))))
        except InputError as e:
            errors.append(e)
    if errors:
        more = f" ({len(errors) - 1} more bad record(s))" if len(errors) > 1 else ""
        raise InputError(errors[0].what, errors[0].problem + more)
    return out
