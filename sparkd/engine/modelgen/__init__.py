"""Pieces of the model generator (`sparkd-engine make-model`): random blocks, tokenizer, specs."""
