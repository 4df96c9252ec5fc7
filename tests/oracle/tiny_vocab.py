"""A tiny byte-level BPE vocabulary GGUF (qwen2 pre-tokenizer), written with gguf.GGUFWriter.

Built from a real vocabulary's first merges: 256 byte tokens, the tokens the first n_merges
merges make, and chat special tokens. Words the few merges do not cover end in byte fallback,
which is the awkward path worth checking. Vocab-only: llama.cpp loads it with vocab_only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import gguf

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")


def _byte_chars() -> list[str]:
    from sparkd.engine.tokenizer import (
        byte_to_char,  # the same table the vocab is written in
    )

    return list(byte_to_char())


def write_tiny_bpe(path: Path, source: Mapping[str, Any], n_merges: int = 600) -> Path:
    """Write the tiny vocabulary to path, taking merges from the source vocab's metadata."""
    tokens = _byte_chars()
    merges: list[str] = []
    known = set(tokens)
    for merge in source["tokenizer.ggml.merges"]:
        left, right = merge.split(" ", 1)
        if left in known and right in known and left + right not in known:
            merges.append(merge)
            tokens.append(left + right)
            known.add(left + right)
            if len(merges) == n_merges:
                break
    types = [gguf.TokenType.NORMAL] * len(tokens) + [gguf.TokenType.CONTROL] * len(SPECIALS)
    tokens += SPECIALS
    w = gguf.GGUFWriter(str(path), arch="qwen2")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
