"""The cost width policy against the best width on measured walls (``bloomery bench moe``): per synthetic acceptance
a, each proposal kept with probability a, chained, so a window of width k yields E(k) = sum_{j<k} a^j ids; the
policy (``width.CostWidth``) is fed walls drawn from the measured ones and its settled width is compared with
argmax_k E(k) / wall(k) over the measured medians."""

from __future__ import annotations

import random
from typing import Any

from ..width import CostWidth

ACCEPTS = (0.5, 0.7, 0.8, 0.9, 0.95)


def expected_ids(a: float, k: int) -> float:
    return sum(a ** j for j in range(k))


def policy_vs_best(table: list[dict[str, Any]], accepts=ACCEPTS, windows: int = 400, seed: int = 0,
                   draft_ms: dict[int, float] | None = None, max_width: int | None = None) -> list[dict[str, Any]]:
    """Per acceptance a: the width CostWidth (widths 1..``max_width``, default every row of ``table``) settles on,
    fed walls drawn from the measured ones, against the best width by the measured median walls. The draft is free,
    or with ``draft_ms`` (width k -> ms the draft takes in a window that verifies k ids, k >= 2) added to every
    drafted wall."""
    rows = max_width or len(table)
    extra = {k: (draft_ms or {}).get(k, 0.0) if k > 1 else 0.0 for k in range(1, rows + 1)}
    walls = {r["rows"]: [w + extra[r["rows"]] for w in r["walls_ms"]] for r in table if r["rows"] <= rows}
    med = {r["rows"]: r["ms"] + extra[r["rows"]] for r in table if r["rows"] <= rows}
    out = []
    for a in accepts:
        rng = random.Random(seed)
        pol = CostWidth(rows)
        for _ in range(windows):
            k = pol.choose()
            kept = 1
            while kept < k and rng.random() < a:
                kept += 1
            pol.observe(k, kept, rng.choice(walls[k]) / 1e3)
        rate = {k: expected_ids(a, k) / med[k] for k in range(1, rows + 1)}
        best = max(rate, key=lambda j: (rate[j], -j))
        chosen = pol.best()
        tail = pol.chosen[-windows // 4:]
        out.append({"accept": a, "policy_width": chosen, "policy_mode_last": max(set(tail), key=tail.count),
                    "best_width": best, "best_ids_per_ms": rate[best], "policy_ids_per_ms": rate[chosen],
                    "policy_over_best": rate[chosen] / rate[best], "tok_s_best": rate[best] * 1e3})
    return out
