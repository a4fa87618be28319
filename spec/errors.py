"""The project's error types: one family, so callers (the CLI above all) can tell bad input from bugs.

Every error raised at a boundary names what was wrong (the config key and value, the tensor and its
shape, the token id, the file), per docs/design.md, "The error policy".
"""

from __future__ import annotations


class DecoderParityError(ValueError):
    """Base class: bad input that the project refused with a message naming the problem."""


class ConfigError(DecoderParityError):
    """A config.json that is malformed or describes a model the spec cannot represent."""


class CheckpointError(DecoderParityError):
    """A checkpoint with missing, unexpected, mis-shaped, truncated, corrupt, non-finite or pickled tensors."""


class InputError(DecoderParityError):
    """Bad token ids or request parameters passed to a model."""


MAX_LISTED = 20  # problems listed in one error: enough to see the pattern, bounded for a corrupt input


def format_problems(problems: list[str], limit: int = MAX_LISTED) -> str:
    """The first `limit` problems, one per indented line, and a count of the rest.

    A config off by an order of magnitude can produce millions of problems; the listing stays readable
    and its size bounded (docs/design.md, "The error policy").
    """
    shown = "\n  ".join(problems[:limit])
    rest = len(problems) - limit
    return "\n  " + shown + (f"\n  ... and {rest} more ({len(problems)} problems in all)" if rest > 0 else "")
