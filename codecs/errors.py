"""Errors raised by the codecs.

``CodecError`` subclasses :class:`ValueError`, the builtin a caller of a numcodecs codec already
catches: a truncated, corrupted or otherwise undecodable payload, or an invalid codec parameter.
``CodecTypeError`` (a ``CodecError`` that is also a :class:`TypeError`) is what numcodecs' own
codecs raise as ``TypeError``: an object array to encode or to decode into, or a codec parameter
of the wrong type.
"""

from __future__ import annotations

__all__ = ["CodecError", "CodecTypeError"]


class CodecError(ValueError):
    """A payload cannot be decoded, or a codec parameter is invalid."""


class CodecTypeError(CodecError, TypeError):
    """An argument of the wrong type: an object array, or a parameter of the wrong type."""
