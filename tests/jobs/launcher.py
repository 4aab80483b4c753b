"""Test job: a launcher that runs its command as a child process (as torchrun or a shell wrapper does).

Usage: launcher.py [--orphan] -- COMMAND...

``--orphan`` also starts ``sleep 600`` in a session of its own that never uses the client and
outlives the launcher unless the executor contains the whole process tree.
"""

from __future__ import annotations

import subprocess
import sys


def main() -> int:
    args = sys.argv[1:]
    orphan = args[:1] == ["--orphan"]
    command = args[args.index("--") + 1:]
    if orphan:
        subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL)
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
