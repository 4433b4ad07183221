"""A byte-level BPE tokenizer (HF ``tokenizers``) trained on the corpus, in Qwen2/Qwen3's layout.

Layout as Qwen ships it: the Qwen2 split regex followed by a ByteLevel pre-tokenizer (no regex of
its own, no prefix space), a ByteLevel decoder, the special tokens ``<|endoftext|>`` (id 0) and
``<|mask|>`` (id 1, the DFlash mask token) as added special tokens, then the 256 byte symbols and
the learned merges up to ``vocab_size``. llama.cpp knows this pre-tokenizer as ``qwen2``.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"
MASK = "<|mask|>"
SPECIALS = (EOT, MASK)
VOCAB_SIZE = 4096
# Qwen2 / Qwen3 pre-tokenizer split (tokenizer.json of Qwen/Qwen3-*).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GGUF_PRE = "qwen2"


def new_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Deterministic for the same texts in the same order (BPE ties break on the pair itself)."""
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    for i, s in enumerate(SPECIALS):
        got = tok.token_to_id(s)
        if got != i:
            raise RuntimeError(f"special token {s} got id {got}, expected {i}")
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, expected {vocab_size}")
    return tok


def tokenizer_json(tok: Tokenizer) -> str:
    return tok.to_str(pretty=True)


def encode_docs(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def vocab_list(tok: Tokenizer) -> list[str]:
    """Token strings in id order (byte-level symbols, as GGUF's tokenizer.ggml.tokens wants them)."""
    inv = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    return [inv[i] for i in range(tok.get_vocab_size())]


def merges_list(tok: Tokenizer) -> list[str]:
    """BPE merges as ``"a b"`` strings in rank order."""
    import json

    model = json.loads(tok.to_str())["model"]
    out = []
    for m in model["merges"]:
        out.append(" ".join(m) if isinstance(m, list) else m)
    return out
