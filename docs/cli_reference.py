"""Write docs/reference/cli.md, the command-line reference, from the argparse parser of ``allocopt``.

Run: ``python docs/cli_reference.py`` (``--check``: change nothing, exit 1 when the page is out of date;
tests/test_docs.py checks it). Every command and subcommand gets its ``--help`` text, formatted 100
columns wide.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "cli.md"
HEADER = """# Command line

Generated from the parser of `allocopt` by `python docs/cli_reference.py`. `python -m allocopt` is the
same program. Each command prints its own help with `allocopt COMMAND --help`; errors in the input are
one line on stderr and an exit status (below), never a traceback.
"""


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps subcommands in its private action list
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    yield path, parser
    for name, sub in _subcommands(parser).items():
        yield from _walk(sub, (*path, name))


def commands():
    """``(path, parser)`` of ``allocopt`` and each of its commands and subcommands, in the parser's order.
    The command line builds some commands' arguments only when that command runs (``_parser(command)``),
    so each command's parser comes from its own build."""
    from allocopt.cli import _parser

    root = _parser()
    yield ("allocopt",), root
    for name in _subcommands(root):
        yield from _walk(_subcommands(_parser(name))[name], ("allocopt", name))


def page() -> str:
    """The reference page's Markdown."""
    os.environ["COLUMNS"] = "100"  # argparse wraps help at the terminal's width
    try:
        parts = [HEADER]
        for path, parser in commands():
            level = "#" * min(len(path) + 1, 4)
            parts.append(f"{level} `{' '.join(path)}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
    finally:
        del os.environ["COLUMNS"]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the page is out of date")
    args = parser.parse_args(argv)
    text = page()
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else None
    if current == text:
        return 0
    if args.check:
        print(f"{PAGE.relative_to(ROOT)} is out of date: run python docs/cli_reference.py", file=sys.stderr)
        return 1
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
