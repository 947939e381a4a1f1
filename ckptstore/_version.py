"""The library's version (its own module, so the manifest step needs no import of the package)."""

__version__ = "0.1.0"
