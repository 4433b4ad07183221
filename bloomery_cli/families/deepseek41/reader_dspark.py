"""The seed engine's V4.1 DSpark draft file (docs/FAMILIES_MOE.md 5.2; the seed's ``dspark.rs`` and
``deepseek41/spec.rs`` ``draft_of``) -> ``Deepseek41DSparkSpec`` for a deepseek41 target.

The layout is llama.cpp's DSV4 DSpark (5.1, ``bloomery_cli.families.deepseek4.reader_dspark``: the same
``dflash.*`` keys, tensor names and shapes, read by its ``read_keys`` / ``shapes`` / ``internal_name``) with the
5.2 differences, each refused by name (exit 2) when the file breaks it:

* keys: every key is required, none defaulted (``block_size``, ``attention.value_length`` (= key_length),
  ``hyper_connection.count`` included), plus ``context_length`` and ``hash_layer_count`` == 0;
  ``rope.scaling.*`` and ``attention.indexer.*`` are ignored;
* keys read as the seed's ``DraftHparams::read`` (``crates/model/src/arch/dspark.rs``): the vocabulary is
  ``vocab_size`` or the length of ``tokenizer.ggml.tokens`` (= the target's and ``markov_w1``'s rows),
  ``target_layers`` strictly increasing;
* tensors (the seed's ``tensors``; any other name is refused, as its ``inventory`` refuses unread names):
  ``conf_proj.weight`` [1, H + r] required and no ``conf_proj.bias`` (the spec has no bias: z = proj . [g ; e]),
  ``markov_w1`` / ``markov_w2`` required; no ``output_hc_*`` (the collapse is LastMix), no ``token_embd`` /
  ``output`` (the target's are used); the Markov rank is the length of a ``markov_w1`` row;
* types (``TYPES``): the norms, sinks, hc mixes, router bias F32; the attention projections, the shared expert
  and ``fc`` Q8_0; the router, ``markov_w1/w2`` and ``conf_proj`` BF16; the routed experts MXFP4. A fixture may
  store a wider float (``WIDER``: BF16 or F32 for Q8_0 / MXFP4, F32 for BF16); any other type is refused.

The spec: ``hc_mix`` "lagged", ``collapse`` "last_mix", ``q_head_norm`` False. Tensors are read eagerly
(dequantized to float32): a fixture-sized draft.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bloomery_gates.errors import BadTensor, Mismatch, Refused
from bloomery_gates.spec import Deepseek41DSparkSpec, Deepseek41Spec

from ...formats.gguf_file import GGUFFile
from ...formats.lazy import check_shapes
from ..deepseek4 import reader_dspark as r4

A = r4.A
F32_PARTS = ("attn_norm.", "attn_q_a_norm.", "attn_kv_a_norm.", "attn_sinks.", "hc_", "exp_probs_b.", "ffn_norm.",
             "enc.output_norm.", "output_norm.")
Q8_PARTS = ("attn_q_a.", "attn_q_b.", "attn_kv.", "attn_output_a.", "attn_output_b.", "_shexp.", "fc.")
BF16_PARTS = ("ffn_gate_inp.", "markov_w1.", "markov_w2.", "conf_proj.weight")
MXFP4_PARTS = ("_exps.",)
WIDER = {"Q8_0": ("BF16", "F32"), "MXFP4": ("BF16", "F32"), "BF16": ("F32",), "F32": ()}
NOT_IN_52 = {"output_hc_fn.weight": "a trained HC head (output_hc_*): the V4.1 DSpark collapses by LastMix",
             "token_embd.weight": "its own token_embd: the V4.1 DSpark uses the target's",
             "output.weight": "its own output head: the V4.1 DSpark uses the target's",
             "conf_proj.bias": "a confidence bias: the V4.1 DSpark's conf_proj has none"}


def type_of(gname: str) -> str:
    """The 5.2 table's type of a GGUF tensor name."""
    leaf = gname.split(".", 2)[2] if gname.startswith("blk.") else gname
    for parts, t in ((F32_PARTS, "F32"), (MXFP4_PARTS, "MXFP4"), (Q8_PARTS, "Q8_0"), (BF16_PARTS, "BF16")):
        if any(leaf.startswith(p) or p in leaf for p in parts):
            return t
    raise BadTensor(gname, "no type in the V4.1 DSpark table (FAMILIES_MOE.md 5.2)")


class Keys52(r4.Keys):
    """Every key required (5.2: "all required, no defaults")."""

    def get(self, key: str, default: Any = None, required: bool = True) -> Any:
        v = self.f.meta(key, None)
        if v is None:
            raise self.bad(key, "missing; the V4.1 DSpark (FAMILIES_MOE.md 5.2) requires every key, none defaulted")
        return v


def read_keys(k: Keys52, target: Deepseek41Spec) -> dict[str, Any]:
    fields = r4.read_keys(k, target)
    k.int(A + "context_length", 1)
    layers = k.ints(A + "target_layers")
    if any(b <= a for a, b in zip(layers, layers[1:], strict=False)):
        raise k.bad(A + "target_layers", f"{layers}; expected strictly increasing (the seed's target_layers)")
    tokens = k.f.meta("tokenizer.ggml.tokens", None)
    vocab = k.f.meta(A + "vocab_size", None) if tokens is None else len(tokens)
    if vocab is None:
        raise k.bad(A + "vocab_size", "missing, and no tokenizer.ggml.tokens: the V4.1 DSpark states its vocabulary")
    if vocab != target.vocab_size:
        raise Mismatch(f"{k.f.path}: key {A}vocab_size", f"{vocab} vs the target's vocab {target.vocab_size}")
    if k.int(A + "hash_layer_count") != 0:
        raise k.bad(A + "hash_layer_count", f"{k.get(A + 'hash_layer_count')}; the DSpark stages are never hashed "
                                            "(expected 0)")
    return fields


def check_types(lazy, table: dict, path: Path) -> None:
    for g in table:
        want, got = type_of(g), lazy.dtype_of(g)
        if got != want and got not in WIDER[want]:
            allowed = " or ".join((want,) + WIDER[want])
            raise BadTensor(f"{path}: tensor {g}", f"type {got}; the V4.1 DSpark stores it as {allowed}")


def deepseek41_dspark_from_gguf(path: Path, target: Deepseek41Spec) -> Deepseek41DSparkSpec:
    """The V4.1 DSpark draft in the GGUF ``path`` for the deepseek41 ``target``."""
    if target.family != "deepseek41":
        raise Mismatch(f"DSpark file {path} vs target {target.source}", f"target family {target.family!r}; this is "
                                                                        "the DeepSeek V4.1 (deepseek41) DSpark layout")
    f = GGUFFile(Path(path))
    fields = read_keys(Keys52(f), target)
    names = set(f.tensor_names())
    for n, why in (r4.REFUSED | NOT_IN_52).items():
        if n in names or n + ".weight" in names:
            raise Refused(f"{path}: tensor {n}", f"{why} is not the V4.1 DSpark layout")
    odd = sorted(n for n in names if "compressor" in n or "indexer" in n or "tid2eid" in n or "output_hc" in n)
    if odd:
        raise Refused(f"{path}: tensor {odd[0]}", "compressors / indexers / hash tables / an HC head: not in the "
                                                  "V4.1 DSpark layout")
    lazy = f.tensors(rename=lambda g: g)
    vocab, rank = r4.markov_shape(lazy, names, path, target.vocab_size)
    if "conf_proj.weight" not in names:
        raise BadTensor(f"{path}: tensor conf_proj.weight", "missing; the V4.1 DSpark carries its confidence head")
    own = {"conf_proj.weight"}
    table = {g: v for g, v in r4.shapes(fields, vocab, rank, own).items() if not g.startswith("output_hc_")}
    check_shapes(lazy, table, path)
    extra = sorted(names - set(table))
    if extra:
        raise BadTensor(f"{path}: tensor {extra[0]}", "not a V4.1 DSpark tensor this reader knows")
    check_types(lazy, table, path)
    if fields["hc"].count > fields["layer"].hidden_size or fields["hc"].count != target.hc.count:
        raise Mismatch(f"{path}: key {A}hyper_connection.count",
                       f"{fields['hc'].count} vs the target's {target.hc.count} streams")
    t = r4.read_tensors(lazy, table, fields["n"])
    return Deepseek41DSparkSpec(kind="deepseek41-dspark", source=Path(path), source_format="gguf",
                                num_layers=fields["n"], block_size=fields["block"], target_layer_ids=fields["ids"],
                                mask_token_id=fields["mask"], markov_rank=rank, confidence=True,
                                collapse="last_mix", vocab_size=vocab, layer=fields["layer"], attn=fields["attn"],
                                moe=fields["moe"], hc=fields["hc"], swiglu_limit=fields["clamp"], tensors=t)

