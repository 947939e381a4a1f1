"""Codec tests: make ``common`` (shared helpers) importable without a package ``__init__``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from simd_paths import each_simd_path  # noqa: E402,F401 - the CPU-path fixture, for every module
