"""``python -m allocopt.bench``: the ``allocopt bench`` command, standalone."""

import sys

from allocopt.bench.cli import run

sys.exit(run())
