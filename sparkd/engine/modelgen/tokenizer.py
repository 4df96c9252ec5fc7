"""A small valid byte-level BPE tokenizer for generated models.

256 byte tokens (GPT-2's byte→unicode table), merges learned from a short built-in text, chat
control tokens, then inert padding tokens up to the requested vocabulary size. llama.cpp knows the
`qwen2` pre-tokenizer, so generated models tokenize the same there and in our tokenizer.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from sparkd.engine.tokenizer import byte_to_char

# llama.cpp token types (gguf.TokenType)
NORMAL, CONTROL, UNUSED = 1, 3, 5
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_CORPUS = """The quick brown fox jumps over the lazy dog. A model of experts routes each token to a few
experts; the rest stay on disk until they are needed. def main(argv):\n    return 0\n
for i in range(10): print(i, i * i)  # squares\nHello, world! How are you today? I am fine, thanks.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2026-11-30. The memory budget is 16 GiB; the disk
reads 11 GB/s. import torch\nimport numpy as np\nclass Engine:\n    def __init__(self, path):\n
        self.path = path\n"""
_PRETOKENIZE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+""")


@dataclass
class TokenizerSpec:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    eos_id: int
    bos_id: int


def _learn_merges(n_merges: int) -> list[tuple[str, str]]:
    b2u = byte_to_char()
    words = Counter(tuple(b2u[b] for b in w.encode()) for w in _PRETOKENIZE.findall(_CORPUS))
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pairs: Counter = Counter()
        for word, n in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        words = Counter({_merge(w, best): n for w, n in words.items()})
    return merges


def _merge(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def make_tokenizer(n_vocab: int) -> TokenizerSpec:
    """A tokenizer with exactly n_vocab tokens (at least 256 bytes + the specials)."""
    minimum = 256 + len(SPECIALS)
    if n_vocab < minimum:
        raise ValueError(f"could not make a tokenizer of {n_vocab} tokens: byte-level BPE needs at "
                         f"least {minimum} (256 bytes + {len(SPECIALS)} control tokens)")
    b2u = byte_to_char()
    tokens = [b2u[b] for b in range(256)]
    merges = _learn_merges(min(n_vocab - minimum, 400))
    seen = set(tokens)
    merges = [m for m in merges if not (m[0] + m[1] in seen or seen.add(m[0] + m[1]))]
    tokens += [a + b for a, b in merges]
    types = [NORMAL] * len(tokens)
    eos = len(tokens)
    tokens += SPECIALS
    types += [CONTROL] * len(SPECIALS)
    pad = n_vocab - len(tokens)
    tokens += [f"[PAD{i}]" for i in range(pad)]
    types += [UNUSED] * pad
    return TokenizerSpec(tokens, types, [f"{a} {b}" for a, b in merges], eos_id=eos, bos_id=eos)
