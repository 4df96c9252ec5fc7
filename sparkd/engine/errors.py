"""One error tree for the engine. Messages say "could not <verb> <object>: <cause>".

The engine never imports the supervisor, so this tree is separate from sparkd.errors.
Errors about a model file carry the file, and where known the tensor and byte offset, as
attributes so callers (the streaming store, the CLI's --json) can report them structurally.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable


class EngineError(Exception):
    """Base of every error the engine reports to a user; str(err) is the whole message."""


class ModelError(EngineError):
    """A model file is missing, malformed or unusable.

    path, tensor and offset name the shard, the tensor and the absolute byte offset the
    problem was found at, where known (None otherwise).
    """

    def __init__(self, message: str, *, path: str | Path | None = None,
                 tensor: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.tensor = tensor
        self.offset = offset


class GGUFFormatError(ModelError):
    """The bytes are not a GGUF this engine can parse (magic, version, value types, layout)."""


class TruncatedFileError(ModelError):
    """A file or shard ends before the header or a tensor's data does."""


class TensorPastEndError(TruncatedFileError):
    """A tensor's data extends past the end of its shard."""


class MissingShardError(ModelError):
    """A shard of a split model is not on disk."""


class ShapeMismatchError(ModelError):
    """A tensor's shape does not fit its type's blocks, its neighbours, or what the caller expects."""


class UnsupportedTypeError(ModelError):
    """A tensor's ggml type is unknown, or known but not dequantizable by this engine."""


class MissingTensorError(ModelError):
    """A tensor the caller asked for is not in the model."""


class MissingKeyError(ModelError):
    """A metadata key the caller needs is not in the model."""


class UnsupportedArchitectureError(ModelError):
    """general.architecture names an architecture this engine has no implementation for."""

    def __init__(self, message: str, *, path: str | Path | None = None,
                 arch: str | None = None, supported: Iterable[str] = ()):
        super().__init__(message, path=path)
        self.arch = arch
        self.supported = sorted(supported)
