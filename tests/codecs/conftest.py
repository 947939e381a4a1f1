"""Codec tests: make ``common`` importable and keep hypothesis quick on 2 cores."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

settings.register_profile(
    "codecs", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
