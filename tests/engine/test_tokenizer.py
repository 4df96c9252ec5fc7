"""Tokenizer on literal metadata: both algorithms by hand, streaming decode, bad metadata."""

import re
import sys
import unicodedata

import pytest

from sparkd.engine import pretokenize
from sparkd.engine.errors import ModelError
from sparkd.engine.tokenizer import BYTE, CONTROL, NORMAL, Tokenizer

# SentencePiece-style: "▁" marks spaces; higher score merges first; unknown chars -> <0xNN>.
SPM_TOKENS = ["<unk>", "<s>", "</s>", "▁", "a", "b", "ab", "▁ab", "ba", "<0xC3>", "<0xA9>", "<end_of_turn>"]
SPM = {
    "tokenizer.ggml.model": "llama",
    "tokenizer.ggml.tokens": SPM_TOKENS,
    "tokenizer.ggml.scores": [0, 0, 0, -1, -2, -2, -0.5, -0.1, -0.3, 0, 0, 0],
    "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 1, 1, BYTE, BYTE, CONTROL],
    "tokenizer.ggml.add_space_prefix": True,
}
# Byte-level BPE: "Ġ" is the space byte; merges in rank order.
BPE = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "qwen2",
    "tokenizer.ggml.tokens": ["a", "b", "Ġ", "ab", "Ġab", "<|im_end|>"],
    "tokenizer.ggml.token_type": [NORMAL] * 5 + [CONTROL],
    "tokenizer.ggml.merges": ["a b", "Ġ ab"],
    "tokenizer.ggml.eos_token_id": 5,
}


def test_spm_merges_by_score_and_adds_bos_and_prefix_space():
    tok = Tokenizer(SPM)
    assert tok.encode("ab") == [1, 7]                          # ▁ a b -> ▁ ab -> ▁ab
    assert tok.encode("bab", add_special=False) == [3, 8, 5]   # ba (-0.3) outscores ab (-0.5)
    assert tok.decode([7]) == "ab"          # the prefix space encode() added is dropped ...
    assert tok.decode([1, 7]) == " ab"      # ... but not after BOS, as llama_detokenize does
    stream = tok.stream()
    assert [stream.push(t) for t in (7, 7)] == [" ab", " ab"]  # a continuation keeps its spaces


def test_spm_byte_fallback_and_streaming_holds_partial_utf8():
    tok = Tokenizer(SPM)
    ids = tok.encode("é", add_special=False)
    assert ids == [3, 9, 10]
    stream = tok.stream()
    assert [stream.push(t) for t in ids] == [" ", "", "é"]


def test_spm_special_token_text_is_parsed_only_when_asked():
    tok = Tokenizer(SPM)
    assert tok.encode("<end_of_turn>", add_special=False) == [11]
    with pytest.raises(ModelError, match="could not encode byte 0x3C .* no <0x3C> token"):
        tok.encode("<end_of_turn>", add_special=False, parse_special=False)
    assert tok.decode([11]) == "" and tok.decode([11], special=True) == "<end_of_turn>"


def test_bpe_merges_by_rank_and_eog_set():
    tok = Tokenizer(BPE)
    assert tok.encode("ab ab", add_special=False) == [3, 4]
    assert tok.encode("ba<|im_end|>") == [1, 0, 5]
    assert tok.decode([3, 4]) == "ab ab"
    assert tok.eog_ids == {5}


def test_a_bpe_tokenizer_compiles_its_split_patterns_when_made_not_at_its_first_encode():
    """The category classes take ~0.1 s (a server's first request waited 0.2-0.9 s for them before session 20)."""
    pretokenize.compiled.cache_clear()
    tok = Tokenizer(BPE)
    assert pretokenize.compiled.cache_info().misses == 1
    tok.encode("ab ab")
    assert pretokenize.compiled.cache_info().misses == 1  # the encode found them compiled


@pytest.mark.parametrize("major", ["L", "N", "P", "S", "M"])
def test_a_category_class_holds_exactly_its_code_points(major):
    """The one-pass classes against unicodedata, every 37th code point and each run's ends."""
    body = pretokenize._category_classes()[major]
    inside = re.compile(f"[{body}]")
    runs = re.findall(r"(\\?.)(?:-(\\?.))?", body)
    ends = {ord(end[-1]) for run in runs for end in run if end}  # an escaped end: its last character
    for cp in sorted(set(range(0, sys.maxunicode + 1, 37)) | ends | {cp + 1 for cp in ends} | {cp - 1 for cp in ends}):
        if 0 <= cp <= sys.maxunicode:
            assert bool(inside.fullmatch(chr(cp))) == (unicodedata.category(chr(cp))[0] == major), hex(cp)


@pytest.mark.parametrize("change,message", [
    ({"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model 'bert' is not supported"),
    ({"tokenizer.ggml.pre": "nonesuch"}, "tokenizer.ggml.pre='nonesuch' is not supported"),
    ({"tokenizer.ggml.merges": ["ab"]}, "merge #0 'ab' has no space"),
    ({"tokenizer.ggml.token_type": [1]}, "fewer entries than the 6 tokens"),
])
def test_bad_metadata_is_named(change, message):
    with pytest.raises(ModelError, match=message):
        Tokenizer({**BPE, **change}, "m.gguf")


def test_missing_key_is_named():
    md = dict(BPE)
    del md["tokenizer.ggml.merges"]
    with pytest.raises(ModelError, match="from m.gguf: metadata key 'tokenizer.ggml.merges' is missing"):
        Tokenizer(md, "m.gguf")


def test_decoding_an_unknown_id_is_refused():
    with pytest.raises(ModelError, match="token id 99.*has 6 tokens"):
        Tokenizer(BPE).decode([99])
