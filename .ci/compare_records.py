"""Compare two folders of gate records (a refactor must not move a verdict, an id or an acceptance figure):
    python3 .ci/compare_records.py OLD_DIR NEW_DIR [GLOB]
Per gate found in both: the verdict, the kept-rows histogram (so accept_mean), every ids line, and the worst
(r) margin, old vs new. Exit 1 when a verdict, a histogram or an ids line differs."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def facts(path: Path) -> dict:
    d = json.loads(path.read_text())
    acc = d.get("acceptance") or {}
    return {"passed": d.get("passed"), "kept": acc.get("kept"), "accept_mean": acc.get("accept_mean"),
            "ids": [x for x in d.get("lines", []) if "ids identical" in x or "ids differ" in x]}


def main() -> int:
    old, new = Path(sys.argv[1]), Path(sys.argv[2])
    glob = sys.argv[3] if len(sys.argv) > 3 else "*.json"
    bad = 0
    for n in sorted(new.glob(glob)):
        o = old / n.name
        if not o.is_file():
            print(f"{n.name:44s} no old record")
            continue
        a, b = facts(o), facts(n)
        same = a["passed"] == b["passed"] and a["kept"] == b["kept"] and a["ids"] == b["ids"]
        bad += not same
        print(f"{n.name:44s} {'same' if same else 'DIFFERS'}: passed {a['passed']}->{b['passed']} "
              f"accept_mean {a['accept_mean']}->{b['accept_mean']}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
