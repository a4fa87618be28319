"""The project's error types: one family, so callers (the CLI above all) can tell bad input from bugs.

Every error raised at a boundary names what was wrong (the config key and value, the tensor and its
shape, the token id, the file), per DESIGN.md's error policy.
"""

from __future__ import annotations


class DecoderParityError(ValueError):
    """Base class: bad input that the project refused with a message naming the problem."""


class ConfigError(DecoderParityError):
    """A config.json that is malformed or describes a model the spec cannot represent."""


class CheckpointError(DecoderParityError):
    """A checkpoint with missing, unexpected, mis-shaped, truncated or pickled tensors."""


class InputError(DecoderParityError):
    """Bad token ids or request parameters passed to a model."""
