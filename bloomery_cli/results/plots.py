"""PNG plots for results/<device>/README.md (matplotlib is a dependency; without it `bloomery results` still writes
the tables). Each plot of one record lies beside that record; the plots over several records lie in the folder
``make_plots`` is given (a device folder such as results/h200/).

- ``kept-histograms.png``: the kept-length histogram (share of windows per kept length), one panel a gate, the
  newest quality record per engine, dtype and sampling (``side.newest_per_gate``).
- ``plot-<record stem>.png``, beside ``<record stem>.json``: drafted tok/s against mean acceptance for each bench
  record with a sweep, beside
  plain tok/s, tau x plain (a free draft and a verify as cheap as a step), the plain roofline and tau x it.
  The roofline drawn is the bytes-read one (bandwidth / bytes a step reads) where the record has it, else
  the copy-rate one (bandwidth / all weight bytes).
- ``plot-shape-<shape>-<device>-<dtype>.png``: per shape (and device, dtype), every bench record's drafted (records
  under a ``speed/`` folder, one session's experiments, are left out)
  curve on one plot (e.g. DFlash2 B=8, B=16 and MTP at qwen38-27b), each record's plain tok/s, and the
  shape's roofline with tau x roofline: the most any drafter can reach at that acceptance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .side import newest_per_gate, sampling_label


def have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def save_png(fig: Any, path: Path) -> None:
    """fig as a PNG of 128 colours at 110 dpi. Line and bar plots use a handful of colours, and the palette makes the
    file about 3x smaller than matplotlib's RGBA, with no visible change; results/ travels with every device call.
    (PIL comes with matplotlib.)"""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    buf.seek(0)
    with Image.open(buf) as im:
        im.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def make_plots(results_dir: Path, records: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """Write the PNGs: a record's own plot beside it, the plots over several records into results_dir; returns their
    paths relative to results_dir, posix ([] without matplotlib). ``records``' paths are relative to results_dir
    (or absolute)."""
    if not have_matplotlib():
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    gates = newest_per_gate(records)
    if gates:
        cols = min(4, len(gates))
        rows = -(-len(gates) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows + 0.6), squeeze=False, sharey=True)
        for ax, (gate, runs) in zip(axes.flat, gates.items(), strict=False):     # more panels than gates
            width = 0.8 / len(runs)
            for j, (path, r) in enumerate(runs):
                kept = r["acceptance"]["kept"]
                total = sum(kept) or 1
                xs = [i + 1 + (j - (len(runs) - 1) / 2) * width for i in range(len(kept))]
                c = r.get("conditions", {})
                engine = (r.get("load") or {}).get("engine")
                ax.bar(xs, [k / total for k in kept], width=width,
                       label=f"{r.get('dtype', '')} {sampling_label(r)}{f' {engine}' if engine else ''} "
                             f"{(c.get('commit') or path.parent.name)[:7]}")
            ax.set_xticks(range(1, max(len(r["acceptance"]["kept"]) for _, r in runs) + 1))
            ax.set_title(gate, fontsize=9)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=6)
        for ax in axes.flat[len(gates):]:
            ax.set_visible(False)
        fig.supxlabel("kept rows per window (bonus included)", fontsize=9)
        fig.supylabel("share of windows", fontsize=9)
        fig.suptitle("kept-length histogram per gate (the newest record per engine, dtype and sampling)", fontsize=10)
        fig.tight_layout()
        save_png(fig, results_dir / "kept-histograms.png")
        plt.close(fig)
        names.append("kept-histograms.png")
    for path, r in records:
        sweep = r.get("sweep") if "bench" in r else None
        if not sweep:
            continue
        plain, (roof, roof_what) = r["plain"]["tok_s"], roofline(r)
        taus = [s["accept_mean"] for s in sweep]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot(taus, [s["tok_s"] for s in sweep], "o-", label="drafted (measured)")
        ax.plot(taus, [t * plain for t in taus], "--", label="tau x plain")
        ax.axhline(plain, color="gray", lw=1, label=f"plain {plain:.0f} tok/s")
        if roof:
            ax.axhline(roof, color="red", lw=1, label=f"plain roofline ({roof_what}) {roof:.0f} tok/s")
            ax.plot(taus, [t * roof for t in taus], ":", color="red", label="tau x roofline")
        c = r.get("conditions", {})
        ax.set_xlabel("mean acceptance tau (kept rows per window)")
        ax.set_ylabel("tok/s")
        ax.set_title(f"{r['bench']} {r.get('shape')} on {c.get('device_name', '?')} {c.get('dtype', '')}, batch 1, "
                     f"prompt {c.get('prompt_len')}", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = Path(path).parent / f"plot-{Path(path).stem}.png"     # beside its record
        save_png(fig, results_dir / name)
        plt.close(fig)
        names.append(name.as_posix())
    names += shape_plots(results_dir, records, plt)
    return names


def roofline(r: dict[str, Any]) -> tuple[float | None, str]:
    """(roofline tok/s, which): the bytes-read one when the record has it, else the copy-rate one."""
    bw = r.get("bandwidth", {})
    if bw.get("roofline_read_tok_s"):
        return bw["roofline_read_tok_s"], "bytes read"
    return bw.get("roofline_tok_s"), "all weights"


def _label(r: dict[str, Any]) -> str:
    """bench, its verify rows per window and its layer count where the record says them."""
    c = r.get("conditions", {})
    return r["bench"] + (f" rows {c['verify_rows']}" if c.get("verify_rows") else "") + \
        (f" layers {c['layers']}" if c.get("layers") else "")


def shape_plots(results_dir: Path, records: list[tuple[Path, dict[str, Any]]], plt) -> list[str]:
    """One plot per (shape, device, dtype) over every bench record with a sweep."""
    groups: dict[tuple[str, str, str], list[tuple[Path, dict[str, Any]]]] = {}
    for path, r in records:
        if "speed" in path.parts:            # one session's experiments (results/h200/speed): their own plots only
            continue
        if "bench" in r and r.get("sweep") and r.get("plain"):
            c = r.get("conditions", {})
            key = (str(r.get("shape")), str(c.get("device_name", c.get("device", "?"))), str(c.get("dtype", "")))
            groups.setdefault(key, []).append((path, r))
    names = []
    for (shape, device, dtype), recs in sorted(groups.items()):
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        top, roof, roof_what = 1.0, None, ""
        for path, r in recs:
            taus = [s["accept_mean"] for s in r["sweep"]]
            line, = ax.plot(taus, [s["tok_s"] for s in r["sweep"]], "o-", label=f"{_label(r)} [{path.stem}]")
            ax.axhline(r["plain"]["tok_s"], color=line.get_color(), lw=0.8, ls="--")
            top = max(top, *taus)
            roof, roof_what = roofline(r) if roof is None else (roof, roof_what)
        if roof:
            xs = [1.0, top]
            ax.plot(xs, [x * roof for x in xs], ":", color="red", label=f"tau x roofline ({roof_what})")
            ax.axhline(roof, color="red", lw=1, label=f"plain roofline {roof:.0f} tok/s")
        ax.set_xlabel("mean acceptance tau (kept rows per window)")
        ax.set_ylabel("tok/s")
        ax.set_title(f"{shape} on {device} {dtype}, batch 1: drafted tok/s (dashed: each record's plain)", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        name = f"plot-shape-{_slug(shape)}-{_slug(device)}-{_slug(dtype)}.png"
        save_png(fig, results_dir / name)
        plt.close(fig)
        names.append(name)
    return names


def _slug(x: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-." else "-" for ch in x).strip("-").lower()
