"""`bloomery inventory FILE...`: a header-only inventory of GGUF and safetensors checkpoints.

Nothing but headers is read: safetensors headers (through ``formats.hf_dir``) and GGUF metadata and
tensor infos (through ``formats.gguf_file``, memory-mapped, no tensor data touched). ``config.json``
beside safetensors files is read as data when present.

For each model given (an HF directory, a set of safetensors shards of one folder, a
``*.safetensors.index.json``, a GGUF, or the parts of a split GGUF) it reports:

- every tensor: name, stored dtype / ggml type, logical shape ([out, in]; GGUF ``ne`` reversed),
  bytes, group;
- bytes per group: token_embd, output, attn (the token mixer: attention, linear attention, SSM,
  with its pre-norm), ffn_dense, router (gate, gate bias and a MoE block's pre-FFN norm),
  ffn_exps_routed, ffn_shexp, mtp_nextn, other. A block is MoE iff it owns routed-expert tensors
  (``*_exps`` / ``experts``);
- metadata: arch / model_type, expert counts, block_count, nextn layers;
- per-token active bytes of the target: every tensor read for one token, routed experts scaled by
  used/total, the MTP/NextN layer left out, an untied token_embd left out (a row lookup);
- a verdict: which draft path the checkpoint takes ("MTP in-file", "MTP sidecar", "block draft",
  "none") and why (the tensors and keys that decided), and whether a drafter for it exists here.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from .groups import _classify
from .model import BLOCK_DRAFT, GROUPS, MTP_IN_FILE, MTP_SIDECAR, NONE, Inventory, ModelInventory, TensorRow
from .read import _gguf_model, _group_inputs, _st_model
from .render import render, to_markdown, write_markdown
from .verdict import _active, _verdict

__all__ = ["BLOCK_DRAFT", "GROUPS", "MTP_IN_FILE", "MTP_SIDECAR", "NONE", "Inventory", "ModelInventory", "TensorRow",
           "inventory", "inventory_command", "render", "to_markdown", "write_markdown"]


def inventory(paths: list[Path]) -> Inventory:
    """Header-only inventory of the given files (raises ``InputError`` naming the bad input)."""
    models: list[ModelInventory] = []
    for kind, files in _group_inputs([Path(p) for p in paths]):
        m = _gguf_model(files) if kind == "gguf" else _st_model(kind, files)
        _classify(m)
        _active(m)
        _verdict(m)
        models.append(m)
    return Inventory(models)


def inventory_command(files: list[Path], markdown: Path | None = None, console: Console | None = None) -> Inventory:
    """What `bloomery inventory FILE... [--markdown PATH]` does; raises ``InputError`` on bad input."""
    inv = inventory(list(files or []))
    render(inv, console or Console())
    if markdown is not None:
        write_markdown(markdown, to_markdown(inv))
    return inv
