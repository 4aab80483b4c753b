"""``python -m allocopt``: the command line (see :mod:`allocopt.cli`)."""

import sys

from allocopt.cli import main

sys.exit(main())
