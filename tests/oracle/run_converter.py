"""Run llama.cpp's convert_hf_to_gguf.py on several models, accepting an unknown BPE pre-tokenizer.

    PYTHONPATH=<llama.cpp>:<llama.cpp>/gguf-py \
        python run_converter.py CONVERT_SCRIPT OUTTYPE MODEL_DIR OUTFILE [MODEL_DIR OUTFILE ...]

The converter identifies a BPE pre-tokenizer by hashing how the tokenizer splits a fixed text,
and refuses unknown hashes. The tiny test tokenizer is unknown by construction; its
pre-tokenizer is then recorded as "qwen2" (a plain byte-level regex split). Nothing else in
the conversion changes, and the logits tests never tokenize text.
"""

import functools
import runpy
import sys

from conversion import base

FALLBACK_PRE_TOKENIZER = "qwen2"


def _with_fallback(detect):
    @functools.wraps(detect)
    def wrapper(self, tokenizer):
        try:
            return detect(self, tokenizer)
        except NotImplementedError:
            return FALLBACK_PRE_TOKENIZER
    return wrapper


if __name__ == "__main__":
    script, outtype, *pairs = sys.argv[1:]
    if not pairs or len(pairs) % 2:
        sys.exit("usage: run_converter.py CONVERT_SCRIPT OUTTYPE MODEL_DIR OUTFILE [...]")
    base.TextModel.get_vocab_base_pre = _with_fallback(base.TextModel.get_vocab_base_pre)
    converter = runpy.run_path(script, run_name="convert_hf_to_gguf")  # defines main() only
    for model_dir, outfile in zip(pairs[::2], pairs[1::2]):
        sys.argv = [script, model_dir, "--outtype", outtype, "--outfile", outfile]
        converter["main"]()
