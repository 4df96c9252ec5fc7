"""Our tokenizer against llama.cpp's on a corpus of awkward strings: identical ids required."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from llama_oracle import llama_detokenize_many, llama_source_dir, llama_tokenize_many
from real_models import gemma3_270m
from sparkd.engine.tokenizer import Tokenizer, read_gguf_metadata
from tiny_vocab import write_tiny_bpe

pytestmark = pytest.mark.oracle

CORPUS = [
    "", " ", "  ", "\n", "\n\n\n", "\t", " \t\n \r\n", "Hello world", " Hello world", "Hello  world ",
    "hello\n\nworld   \n", "I'm sure you've heard they'll say it's OK, DON'T", "'s 'S 'tis",
    "3.14159 and 1234567890 and 1,000,000.00 and ١٢٣ and ½ and Ⅻ", "x=1;y=22;z=333;w=4444",
    "def f(x):\n    return x**2  # square\n\tpass\n", "if (a && b || !c) { arr[i++] = *p->q; }",
    "naïve café résumé Ångström", "Здравствуйте, мир! Привет.", "Γειά σου Κόσμε",
    "日本語のテキストと漢字、カタカナ。", "中文文本，包括标点符号！", "한국어 텍스트입니다",
    "مرحبا بالعالم", "שלום עולם", "हिन्दी पाठ", "ภาษาไทย",
    "emoji 😀👍🏽 👨‍👩‍👧‍👦 🇺🇸 ❤️", "zero\u200bwidth\u200d joiner \ufeffbom", "nbsp\u00a0here\u3000ideo",
    "\u2028line\u2029para\x85nel", "control \x01\x1c\x1f chars", "<b>html</b> &amp; <br/>",
    "https://example.com/path?q=1&r=two#frag", "user@example.org", "$$$ %%% ^^^ ~~~ ```",
    "ALLCAPS and camelCase and snake_case and kebab-case", "a" * 50, "ab " * 20,
    " leading and trailing spaces  ", "...!!!???", "’curly’ “quotes” — dashes –",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<bos><start_of_turn>user\nhi<end_of_turn>",
    "<think>plan</think>answer", "<|endoftext|><|endoftext|>", "<s>[INST] hi [/INST]",
]
# llama.cpp's own test vocabularies (vocab-only GGUFs in the vendored source).
VENDORED = ["qwen2", "qwen35", "llama-bpe", "gpt-2", "deepseek-coder", "starcoder", "command-r",
            "llama-spm", "phi-3"]


@functools.cache
def _gguf(name: str, tmp_root: str) -> Path:
    if name == "gemma3-270m":
        return gemma3_270m()
    vendored = llama_source_dir() / "models"
    if name == "tiny-bpe":
        source = read_gguf_metadata(vendored / "ggml-vocab-qwen2.gguf")
        return write_tiny_bpe(Path(tmp_root) / "tiny-bpe.gguf", source)
    return vendored / f"ggml-vocab-{name}.gguf"


@functools.cache
def _tokenizer(path: Path) -> Tokenizer:
    return Tokenizer(read_gguf_metadata(path), str(path))


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("vocab"))


@pytest.mark.parametrize("add_special,parse_special", [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("name", ["gemma3-270m", "tiny-bpe", *VENDORED])
def test_encode_matches_llama_cpp(name, add_special, parse_special, tmp_root):
    path = _gguf(name, tmp_root)
    tok = _tokenizer(path)
    want = llama_tokenize_many(path, CORPUS, add_special, parse_special)
    mismatches = [(text, got, exp) for text, exp in zip(CORPUS, want)
                  if (got := tok.encode(text, add_special, parse_special)) != exp]
    assert not mismatches, f"{len(mismatches)} of {len(CORPUS)} differ; first: {mismatches[0]}"


@pytest.mark.parametrize("name", ["gemma3-270m", "tiny-bpe", "qwen2", "llama-spm"])
def test_decode_matches_llama_cpp(name, tmp_root):
    """Byte-exact pieces (these vocabularies do not clean up spaces on decode)."""
    path = _gguf(name, tmp_root)
    tok = _tokenizer(path)
    ids = [tok.encode(text, add_special=False) for text in CORPUS if text]
    want = llama_detokenize_many(path, ids, remove_special=False, unparse_special=True)
    got = [b"".join(tok.piece(t, k == 0, special=True) for k, t in enumerate(row)) for row in ids]
    assert got == want


def test_gemma3_round_trip_and_streaming():
    tok = _tokenizer(gemma3_270m())
    for text in CORPUS:
        ids = tok.encode(text, add_special=False)
        assert tok.decode(ids, special=True) == text
        stream = tok.stream(special=True, whole_text=True)
        assert "".join(stream.push(t) for t in ids) + stream.flush() == text
