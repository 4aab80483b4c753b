"""``python -m allocopt``: the command line (see :mod:`allocopt.cli`)."""

import sys

try:
    from allocopt.cli import main
except KeyboardInterrupt:  # Ctrl-C while importing: the same one line as during a command
    print("allocopt: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
