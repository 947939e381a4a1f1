"""Errors raised by the codecs.

``CodecError`` subclasses :class:`ValueError`, the builtin a caller of a numcodecs codec already
catches: a truncated, corrupted or otherwise undecodable payload, or an invalid codec parameter.
"""

from __future__ import annotations

__all__ = ["CodecError"]


class CodecError(ValueError):
    """A payload cannot be decoded, or a codec parameter is invalid."""
