"""``<arch>.rope.dimension_sections`` of the qwen35 GGUF arch: llama.cpp's interleaved multi-section RoPE.

llama.cpp runs every qwen35 attention layer (and its MTP layer) through ``ggml_rope_multi`` in mode IMROPE
(``llama_model_rope_type``: QWEN35 -> LLAMA_ROPE_TYPE_IMROPE), with the four ``sections`` [s0, s1, s2, s3] from
the key (required by the qwen35 loader, an array of exactly 4 or one scalar repeated). Read from ggml-cpu
``ggml_mrope_cache_init`` (llama.cpp 0c1e57098, vendored in llama-cpp-python 0.3.36):

    the head's first n_rot channels rotate as NeoX halves: pair i = (channel i, channel i + n_rot/2),
    i = 0 .. n_rot/2 - 1, by the angle  p_{s(i)} * base^(-2 i / n_rot)      (the same frequency for every
    section: only the POSITION STREAM s(i) depends on the sections)
    S = s0 + s1 + s2 + s3,  k = i mod S
    s(i) = t  if k % 3 == 0 and k < 3 s0
           h  if k % 3 == 1 and k < 3 s1
           w  if k % 3 == 2 and k < 3 s2
           e  otherwise

For a text token llama.cpp fills the four position streams as t = h = w = the token's position and e = 0
(``llm_graph_input_pos::set_input``: "the 3 first dims are the same, and 4th dim is all 0"). So a pair in
stream t, h or w rotates by exactly plain partial RoPE's angle, and a pair in stream e is left unrotated
(angle 0) at every position. A section layout in which every pair i < n_rot/2 falls in t, h or w is therefore
plain partial RoPE (what our engine and reference compute, and HF's Qwen3.5 text rotary); one that sends any
pair to e is not. Example: [4, 0, 0, 0] with n_rot = 8 (4 pairs): S = 4, k = 0..3 -> t, e, e, t: pairs 1 and 2
never rotate. The converter's [11, 11, 10, 0] on the same head: S = 32, k = 0..3 -> t, h, w, t: all rotate.

ggml also asserts s0 + s1 + s2 > 0 and S <= the head's row length (head_dim); a file breaking either aborts
llama.cpp's process, so both are refused here too.

llama.cpp's converter (``conversion/qwen.py``, ``_Qwen35MRopeMixin``, for Qwen3_5ForCausalLM and the
multimodal class alike) writes ``rope_parameters["mrope_section"]`` padded to 4 when the config has it and
otherwise the Qwen3.5 default ``[11, 11, 10, 0]``.
"""

from __future__ import annotations

from collections.abc import Sequence

CONVERTER_DEFAULT = (11, 11, 10, 0)     # llama.cpp's _Qwen35MRopeMixin._QWEN35_DEFAULT_MROPE_SECTION


def stream_of(pair: int, sections: Sequence[int]) -> str:
    """The position stream ('t', 'h', 'w' or 'e') that rotary pair ``pair`` takes under IMROPE."""
    s0, s1, s2 = sections[0], sections[1], sections[2]
    k = pair % sum(sections)
    if k % 3 == 1 and k < 3 * s1:
        return "h"
    if k % 3 == 2 and k < 3 * s2:
        return "w"
    if k % 3 == 0 and k < 3 * s0:
        return "t"
    return "e"


def unrotated_pairs(sections: Sequence[int], n_pairs: int) -> list[int]:
    """The pairs i < ``n_pairs`` that fall in stream e: at a text position llama.cpp never rotates them."""
    return [i for i in range(n_pairs) if stream_of(i, sections) == "e"]


def sections_problem(sections: object, rotary_dim: int, head_dim: int) -> str | None:
    """Why ``sections`` (the key's value) is not plain partial RoPE of ``rotary_dim`` channels as llama.cpp
    runs it, or None when it is."""
    if isinstance(sections, int) and not isinstance(sections, bool):
        sections = [sections] * 4
    if (not isinstance(sections, list) or len(sections) != 4
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sections)):
        return f"{sections!r}; expected 4 non-negative integers (llama.cpp's qwen35 loader reads exactly 4)"
    if sum(sections[:3]) == 0:
        return f"{sections}; expected s0 + s1 + s2 > 0 (ggml's multi-section rope asserts it)"
    if sum(sections) > head_dim:
        return (f"{sections} sum to {sum(sections)} > head_dim {head_dim} (ggml's multi-section rope asserts "
                "sum <= head_dim)")
    bad = unrotated_pairs(sections, rotary_dim // 2)
    if bad:
        return (f"{sections} leave rotary pairs {bad} of {rotary_dim // 2} unrotated under llama.cpp's interleaved "
                "rope (stream e, position 0 for text); expected a layout covering every pair, e.g. llama.cpp's "
                f"converter default {list(CONVERTER_DEFAULT)}")
    return None


def writer_sections(rotary_dim: int, head_dim: int) -> list[int]:
    """The sections our GGUF writer stores: the converter's default [11, 11, 10, 0] (what llama.cpp's converter
    writes for a Qwen3.5 text config without ``mrope_section``) whenever it fits the head (sum 32 <= head_dim;
    every real Qwen3.5 head). A smaller head (test shapes only: llama.cpp would abort on the default) gets the
    even interleave [ceil(n/3), ceil((n-1)/3), ceil((n-2)/3), 0] of its n = rotary_dim/2 pairs, which sends
    pair i to stream (t, h, w)[i % 3]: every pair covered, sum n <= head_dim."""
    if sum(CONVERTER_DEFAULT) <= head_dim:
        return list(CONVERTER_DEFAULT)
    n = rotary_dim // 2
    return [-(-n // 3), -(-(n - 1) // 3), -(-(n - 2) // 3), 0]
