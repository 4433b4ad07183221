"""PNG plots for results/README.md, made only when matplotlib imports (an optional extra: ``.[plots]``).

- ``kept-histograms.png``: the kept-length histogram of each gate record (share of windows per kept length).
- ``plot-<record>.png``: drafted tok/s against mean acceptance for each bench record with a sweep, beside
  plain tok/s, tau x plain (a free draft and a verify as cheap as a step), the plain roofline and tau x it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def make_plots(results_dir: Path, records: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """Write the PNGs into results_dir; returns their names ([] without matplotlib)."""
    if not have_matplotlib():
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    gates = [(p, r) for p, r in records if "gate" in r and r.get("acceptance", {}).get("kept")]
    if gates:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        width = 0.8 / len(gates)
        for j, (path, r) in enumerate(gates):
            kept = r["acceptance"]["kept"]
            total = sum(kept) or 1
            xs = [i + 1 + (j - (len(gates) - 1) / 2) * width for i in range(len(kept))]
            ax.bar(xs, [k / total for k in kept], width=width,
                   label=f"{r['gate']} {r.get('device', '')} {r.get('dtype', '')} ({path.parent.name})")
        ax.set_xlabel("kept rows per window (bonus included)")
        ax.set_ylabel("share of windows")
        ax.set_title("kept-length histogram per gate record")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(results_dir / "kept-histograms.png", dpi=110)
        plt.close(fig)
        names.append("kept-histograms.png")
    for path, r in records:
        sweep = r.get("sweep") if "bench" in r else None
        if not sweep:
            continue
        plain, roof = r["plain"]["tok_s"], r.get("bandwidth", {}).get("roofline_tok_s")
        taus = [s["accept_mean"] for s in sweep]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot(taus, [s["tok_s"] for s in sweep], "o-", label="drafted (measured)")
        ax.plot(taus, [t * plain for t in taus], "--", label="tau x plain")
        ax.axhline(plain, color="gray", lw=1, label=f"plain {plain:.0f} tok/s")
        if roof:
            ax.axhline(roof, color="red", lw=1, label=f"plain roofline {roof:.0f} tok/s")
            ax.plot(taus, [t * roof for t in taus], ":", color="red", label="tau x roofline")
        c = r.get("conditions", {})
        ax.set_xlabel("mean acceptance tau (kept rows per window)")
        ax.set_ylabel("tok/s")
        ax.set_title(f"{r['bench']} {r.get('shape')} on {c.get('device_name', '?')} {c.get('dtype', '')}, batch 1, "
                     f"prompt {c.get('prompt_len')}", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"plot-{path.stem}.png"
        fig.savefig(results_dir / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names
