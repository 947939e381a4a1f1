"""``python -m ckptstore``: the ``ckpt`` command."""

import sys

from .cli import main

sys.exit(main())
