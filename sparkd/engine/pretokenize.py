"""Pre-tokenizer split rules for byte-level BPE vocabularies, keyed by GGUF `tokenizer.ggml.pre`.

The patterns are the Unicode-category regexes the models' tokenizer.json files use, in the
adapted form llama.cpp runs (case-insensitive contractions spelled out). Python's `re` has no
\\p{..}, so categories are expanded into explicit character classes built from unicodedata.
Like llama.cpp, letter subcategories (Lu, Ll, ...) all count as letters, and \\s means the
Unicode White_Space property (Python's own \\s also matches U+001C..U+001F, llama.cpp does not).

A vocabulary has a list of patterns; each one splits every piece the previous ones produced,
and text between matches stays a piece of its own.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

# Unicode White_Space: the set llama.cpp's tables mark as whitespace.
_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_CATEGORY_OF = {"L": "L", "Lu": "L", "Ll": "L", "Lt": "L", "Lm": "L", "Lo": "L",
                "N": "N", "P": "P", "S": "S", "M": "M"}

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# GPT-4o style: an upper-case run may start a word, lower-case letters continue it. The
# lookahead form keeps non-ASCII letters matching both halves, as llama.cpp does.
_UPPER = r"(?:(?=\p{L})[^a-z])"
_LOWER = r"(?:(?=\p{L})[^A-Z])"
_GPT4O = (r"[^\r\n\p{L}\p{N}]?" + _UPPER + "*" + _LOWER + "+" + _CONTRACTIONS + "?"
          r"|[^\r\n\p{L}\p{N}]?" + _UPPER + "+" + _LOWER + "*" + _CONTRACTIONS + "?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
_DEEPSEEK_CODER = ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
                   r"\p{N}")
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")

# tokenizer.ggml.pre value -> split patterns, applied in order.
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "default": _DEFAULT,
    **{name: (_GPT2,) for name in ("gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "exaone4")},
    **{name: (_LLAMA3,) for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx",
                                     "smaug-bpe", "chatglm-bpe", "glm4", "glm5")},
    **{name: (_QWEN2,) for name in ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan")},
    "qwen35": (_QWEN35,),
    **{name: (_GPT4O,) for name in ("gpt-4o", "llama4", "minimax-m2")},
    "deepseek-v3": _DEEPSEEK3,
    "deepseek-coder": _DEEPSEEK_CODER,
    **{name: (r"\p{N}", _GPT2) for name in ("starcoder", "refact", "command-r", "smollm",
                                            "codeshell", "exaone", "minerva-7b")},
}
# Vocabularies whose whole pre-tokenized word is looked up before merging (llama.cpp's ignore_merges).
IGNORE_MERGES = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "glm4", "glm5"})
# Vocabularies that add BOS unless the GGUF says otherwise.
ADD_BOS_BY_DEFAULT = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3"})


@functools.cache
def _category_classes() -> dict[str, str]:
    """Body of a character class per major category (L, N, P, S, M, ...) holding every code point of it: one
    pass over the code points for all of them (0.1 s here; it was a pass per category, each as long)."""
    runs: dict[str, list[tuple[int, int]]] = {}
    category = unicodedata.category
    start, current = 0, category("\0")[0]
    for cp in range(1, sys.maxunicode + 1):
        major = category(chr(cp))[0]
        if major != current:
            runs.setdefault(current, []).append((start, cp - 1))
            start, current = cp, major
    runs.setdefault(current, []).append((start, sys.maxunicode))
    return {major: "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
                           for a, b in spans) for major, spans in runs.items()}


def _class_body(escape: str) -> str:
    if escape == r"\s":
        return _WHITESPACE
    return _category_classes()[_CATEGORY_OF[escape[3:-1]]]


_ESCAPE = re.compile(r"\\p\{(?:L[ultmo]?|N|P|S|M)\}|\\[sS]|\\.|\[|\]|.", re.S)


def translate(pattern: str) -> str:
    """Rewrite \\p{..}, \\s and \\S of a pattern into explicit classes for Python's `re`."""
    out: list[str] = []
    in_class = False
    for tok in _ESCAPE.findall(pattern):
        if tok == "[" and not in_class:
            in_class = True
        elif tok == "]" and in_class:
            in_class = False
        elif tok.startswith(r"\p") or tok == r"\s":
            tok = _class_body(tok) if in_class else f"[{_class_body(tok)}]"
        elif tok == r"\S":
            if in_class:
                raise ValueError(f"could not translate pattern {pattern!r}: \\S inside a class")
            tok = f"[^{_WHITESPACE}]"
        out.append(tok)
    return "".join(out)


@functools.cache
def compiled(pre: str) -> tuple[re.Pattern, ...]:
    """The split patterns of a pre-tokenizer, compiled once a process (Tokenizer does it when it is made: the
    category classes take ~0.1 s, a load's time rather than a server's first request's)."""
    return tuple(re.compile(translate(p)) for p in PRE_TOKENIZERS[pre])


def split(text: str, pre: str) -> list[str]:
    """Split text into the words BPE merges within, as llama.cpp does for this pre-tokenizer."""
    pieces = [text] if text else []
    for pattern in compiled(pre):
        out: list[str] = []
        for piece in pieces:
            # finditer over the piece alone: its end is the end for lookaheads, as in llama.cpp.
            pos = 0
            for m in pattern.finditer(piece):
                if m.start() > pos:
                    out.append(piece[pos:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                pos = m.end()
            if pos < len(piece):
                out.append(piece[pos:])
        pieces = out
    return pieces
