"""Tokenizer built from GGUF metadata, token-for-token equal to llama.cpp's.

Two vocabulary kinds (`tokenizer.ggml.model`):
- "gpt2": byte-level BPE. Text is split by the pre-tokenizer (sparkd.engine.pretokenize), each
  word is mapped byte -> printable character, then merged by merge rank.
- "llama": SentencePiece-style BPE over scores (Gemma, Llama 2). Spaces become U+2581, the
  highest-scoring adjacent pair that is a vocabulary entry merges first, characters left
  unknown fall back to <0xNN> byte tokens.
Special tokens (control, user-defined, unknown) are cut out of the text first, longest first.
"""

from __future__ import annotations

import codecs
import functools
import heapq
from pathlib import Path
from typing import Any, Iterable, Mapping

from sparkd.engine import pretokenize
from sparkd.engine.errors import ModelError

# GGUF token types (tokenizer.ggml.token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_SPACE_MARK = "\u2581"
# Token texts that end a turn or a generation, as llama.cpp recognises them by name.
EOG_NAMES = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "<|end_of_text|>",
    "<end_of_utterance>", "<｜end▁of▁sentence｜>",
})
# gpt-oss markup that llama.cpp always renders, even when special tokens are hidden.
_ALWAYS_RENDERED = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})


@functools.cache
def byte_to_char() -> tuple[str, ...]:
    """GPT-2's reversible byte -> printable character table: printable Latin-1 bytes stand for
    themselves, the others take code points from 256 upward in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


@functools.cache
def _char_to_byte() -> dict[str, int]:
    return {c: b for b, c in enumerate(byte_to_char())}


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """Metadata of a GGUF file (first shard) as a plain dict."""
    from sparkd.engine.gguf_file import GGUFModel

    with GGUFModel.open(path) as model:
        return dict(model.metadata)


class Tokenizer:
    """encode/decode for one vocabulary; `metadata` is the GGUF key/value dict."""

    def __init__(self, metadata: Mapping[str, Any], source: str = "<metadata>"):
        self.source = source
        self.model = self._get(metadata, "tokenizer.ggml.model")
        self.tokens: list[str] = list(self._get(metadata, "tokenizer.ggml.tokens"))
        n = len(self.tokens)
        types = metadata.get("tokenizer.ggml.token_type")
        self.types: list[int] = list(types) if types is not None else [NORMAL] * n
        scores = metadata.get("tokenizer.ggml.scores")
        self.scores: list[float] = list(scores) if scores is not None else [0.0] * n
        if len(self.types) < n or len(self.scores) < n:
            raise ModelError(f"could not build the tokenizer from {source}: token_type or scores "
                             f"has fewer entries than the {n} tokens")
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.pre = str(metadata.get("tokenizer.ggml.pre", "default"))
        if self.model == "gpt2":
            self._init_bpe(metadata)
        elif self.model == "llama":
            self.pre = "default"
            self.add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
            self.add_bos = True
        else:
            raise ModelError(f"could not build the tokenizer from {source}: tokenizer.ggml.model "
                             f"{self.model!r} is not supported (supported: gpt2, llama)")
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", self.add_bos))
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        # llama.cpp's defaults when the GGUF names no BOS/EOS: 11 for BPE, 1 and 2 for SentencePiece.
        self.bos_id = self._special_id(metadata, "bos", 11 if self.model == "gpt2" else 1)
        self.eos_id = self._special_id(metadata, "eos", 11 if self.model == "gpt2" else 2)
        self._fix_attributes(metadata)
        # Longest first, so "<|im_end|>" is cut before any shorter token inside it.
        self._specials = sorted((i for i, t in enumerate(self.types) if t in (CONTROL, USER_DEFINED, UNKNOWN)),
                                key=lambda i: (-len(self.tokens[i]), i))

    def _get(self, metadata: Mapping[str, Any], key: str) -> Any:
        if key not in metadata:
            raise ModelError(f"could not build the tokenizer from {self.source}: metadata key "
                             f"{key!r} is missing")
        return metadata[key]

    def _init_bpe(self, metadata: Mapping[str, Any]) -> None:
        if self.pre not in pretokenize.PRE_TOKENIZERS:
            raise ModelError(
                f"could not build the tokenizer from {self.source}: pre-tokenizer "
                f"tokenizer.ggml.pre={self.pre!r} is not supported (supported: "
                f"{', '.join(sorted(pretokenize.PRE_TOKENIZERS))})")
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(self._get(metadata, "tokenizer.ggml.merges")):
            cut = merge.find(" ", 1)
            if cut < 0:
                raise ModelError(f"could not build the tokenizer from {self.source}: merge "
                                 f"#{rank} {merge!r} has no space between its two parts")
            self.ranks.setdefault((merge[:cut], merge[cut + 1:]), rank)  # first occurrence wins
        self.ignore_merges = self.pre in pretokenize.IGNORE_MERGES
        pretokenize.compiled(self.pre)  # now, not in the first encode: a server's first request waited 0.2-0.9 s
        self._word_ids: dict[str, tuple[int, ...]] = {}
        self.add_space_prefix = False
        self.add_bos = self.pre in pretokenize.ADD_BOS_BY_DEFAULT

    def _special_id(self, metadata: Mapping[str, Any], name: str, default: int | None) -> int | None:
        value = metadata.get(f"tokenizer.ggml.{name}_token_id", default)
        return value if value is not None and 0 <= value < len(self.tokens) else None

    def _fix_attributes(self, metadata: Mapping[str, Any]) -> None:
        """Token-type corrections llama.cpp applies by name, and the end-of-generation set."""
        eog = {i for i in (self.eos_id, self._special_id(metadata, "eot", None),
                           self._special_id(metadata, "eom", None)) if i is not None}
        for text in EOG_NAMES:
            if text in self.ids:
                eog.add(self.ids[text])
                self.types[self.ids[text]] = CONTROL
        # gpt-oss (harmony): <|end|> only ends a message, <|return|>/<|call|> end generation.
        if {"<|return|>", "<|call|>", "<|end|>"} <= self.ids.keys():
            eog.discard(self.ids["<|end|>"])
            self.types[self.ids["<|end|>"]] = USER_DEFINED
        for text in _ALWAYS_RENDERED & self.ids.keys():
            self.types[self.ids[text]] = USER_DEFINED
        self.eog_ids = frozenset(eog)

    # --- encode ---------------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of text. add_special adds BOS/EOS where the vocabulary asks for them;
        parse_special turns control-token texts inside `text` into their ids."""
        out: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        prev_special = True
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
            elif self.model == "gpt2":
                for word in pretokenize.split(frag, self.pre):
                    out.extend(self._bpe_word("".join(byte_to_char()[b] for b in word.encode())))
            else:
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                out.extend(self._spm(frag.replace(" ", _SPACE_MARK)))
                prev_special = False
        if add_special and self.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        frags: list[str | int] = [text] if text else []
        for tid in self._specials:
            if not parse_special and self.types[tid] != USER_DEFINED:
                continue
            piece = self.tokens[tid]
            if not any(isinstance(f, str) and piece in f for f in frags):
                continue
            out: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or piece not in f:
                    out.append(f)
                    continue
                for k, part in enumerate(f.split(piece)):
                    if k:
                        out.append(tid)
                    if part:
                        out.append(part)
            frags = out
        return frags

    def _bpe_word(self, word: str) -> tuple[int, ...]:
        ids = self._word_ids.get(word)
        if ids is None:
            ids = self._word_ids[word] = self._merge_word(word)
        return ids

    def _merge_word(self, word: str) -> tuple[int, ...]:
        if self.ignore_merges and word in self.ids:
            return (self.ids[word],)
        syms = list(word)
        while len(syms) > 1:
            # The lowest-ranked pair merges first; ties go to the leftmost pair.
            best, at = None, -1
            for k in range(len(syms) - 1):
                rank = self.ranks.get((syms[k], syms[k + 1]))
                if rank is not None and (best is None or rank < best):
                    best, at = rank, k
            if best is None:
                break
            syms[at:at + 2] = [syms[at] + syms[at + 1]]
        out: list[int] = []
        for s in syms:
            if s in self.ids:
                out.append(self.ids[s])
            else:  # llama.cpp falls back to single-byte entries and drops what has none
                out.extend(self.ids[c] for c in s if len(c.encode()) == 1 and c in self.ids)
        return tuple(out)

    def _spm(self, text: str) -> list[int]:
        syms = list(text)
        nxt = list(range(1, len(syms))) + [-1]
        prv = list(range(-1, len(syms) - 1))
        heap: list[tuple[float, int, int, int]] = []

        def push(left: int, right: int) -> None:
            if left >= 0 and right >= 0:
                tid = self.ids.get(syms[left] + syms[right])
                if tid is not None:
                    # Highest score first, then the leftmost pair.
                    heapq.heappush(heap, (-self.scores[tid], left, right, len(syms[left]) + len(syms[right])))

        for k in range(len(syms) - 1):
            push(k, k + 1)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if not syms[left] or not syms[right] or len(syms[left]) + len(syms[right]) != size:
                continue  # stale: one side has merged since this pair was queued
            syms[left] += syms[right]
            syms[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        out: list[int] = []
        for s in filter(None, syms):
            if s in self.ids:
                out.append(self.ids[s])
            else:
                out.extend(self._byte_token(b) for b in s.encode())
        return out

    def _byte_token(self, byte: int) -> int:
        tid = self.ids.get(f"<0x{byte:02X}>")
        if tid is None and byte < 0x80:
            tid = self.ids.get(chr(byte))
        if tid is None:
            raise ModelError(f"could not encode byte 0x{byte:02X} with the vocabulary of "
                             f"{self.source}: it has no <0x{byte:02X}> token")
        return tid

    # --- decode ---------------------------------------------------------------------------------

    def token_bytes(self, tid: int, special: bool = False) -> bytes:
        """The bytes one token stands for; control tokens are empty unless `special`."""
        if not 0 <= tid < len(self.tokens):
            raise ModelError(f"could not decode token id {tid}: the vocabulary of {self.source} "
                             f"has {len(self.tokens)} tokens")
        kind, text = self.types[tid], self.tokens[tid]
        if kind in (CONTROL, UNKNOWN):
            return text.encode() if special else b""
        if kind == USER_DEFINED:
            return text.encode()
        if kind == BYTE:
            return bytes([int(text[3:5], 16)]) if self.model == "llama" else text.encode()
        if kind != NORMAL:
            return b""
        if self.model == "llama":
            return text.replace(_SPACE_MARK, " ").encode()
        table = _char_to_byte()
        return bytes(table[c] for c in text if c in table)

    def piece(self, tid: int, first: bool, special: bool = False) -> bytes:
        """token_bytes, less the space encode() put in front of the text (add_space_prefix)."""
        data = self.token_bytes(tid, special)
        if first and self.add_space_prefix and data.startswith(b" "):
            return data[1:]
        return data

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of ids; bytes that do not form UTF-8 become U+FFFD."""
        data = b"".join(self.piece(t, k == 0, special) for k, t in enumerate(ids))
        return data.decode("utf-8", errors="replace")

    def stream(self, special: bool = False, whole_text: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, special, whole_text)

    def __len__(self) -> int:
        return len(self.tokens)


class StreamDecoder:
    """Decodes tokens one at a time; a UTF-8 character split across tokens is held back until
    it is complete. whole_text: the tokens start a text (not continue a prompt), so the
    SentencePiece prefix space is dropped and the outputs joined equal decode()."""

    def __init__(self, tokenizer: Tokenizer, special: bool = False, whole_text: bool = False):
        self._tok = tokenizer
        self._special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = whole_text

    def push(self, tid: int) -> str:
        data = self._tok.piece(tid, self._first, self._special)
        self._first = False
        return self._utf8.decode(data)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
