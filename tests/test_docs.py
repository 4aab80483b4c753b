"""Every ```python and ```sh block of the README, docs/**/*.md and examples/README.md runs as written.

Python blocks of one page run in order in one interpreter (later blocks may use
names defined by earlier ones, as a reader typing them into a session would);
each shell block runs with bash. Both run in a scratch copy of the repository
(so relative paths such as ``allocopt/data/...`` resolve and written files do
not land in the checkout), with ``allocopt`` and ``python`` on PATH meaning this
interpreter and this checkout's package. A block that cannot run here (it needs
the network, a GPU, a Ray cluster or a long time) is preceded by a visible
``<!-- no-test: reason -->`` comment; ``<!-- test-env: NAME=value ... -->``
sets environment variables for the block (e.g. those a job gets from the
scheduler).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "examples" / "README.md"]
LANGUAGES = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh", "console": "sh"}
FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)\s*$")
NO_TEST = re.compile(r"^<!--\s*no-test:\s*(.+?)\s*-->$")
TEST_ENV = re.compile(r"^<!--\s*test-env:\s*(.+?)\s*-->$")
TIMEOUT_S = 300
IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                ".hypothesis", ".cache", "bench-results", "site")


@dataclass
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    language: str  # "python" or "sh"
    code: str
    skip: str | None = None  # the no-test reason
    env: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The python and shell blocks of ``page``, with the markers of the comment lines right above each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    k = 0
    while k < len(lines):
        opening = FENCE.match(lines[k])
        if not opening:
            k += 1
            continue
        ticks, language = opening.groups()
        end = next((j for j in range(k + 1, len(lines)) if lines[j].strip() == ticks), None)
        assert end is not None, f"{page.relative_to(ROOT)}:{k + 1}: code block never closed"
        if language.lower() in LANGUAGES:
            block = Block(page, k + 1, LANGUAGES[language.lower()], "\n".join(lines[k + 1:end]) + "\n")
            j = k - 1
            while j >= 0 and lines[j].strip().startswith("<!--"):
                marker = lines[j].strip()
                if m := NO_TEST.match(marker):
                    block.skip = m.group(1)
                elif m := TEST_ENV.match(marker):
                    block.env.update(item.split("=", 1) for item in shlex.split(m.group(1)))
                j -= 1
            out.append(block)
        k = end + 1
    return out


ALL = [b for page in PAGES for b in blocks(page)]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> dict[str, object]:
    """A copy of the repository and an environment whose ``allocopt`` and ``python`` are this checkout's."""
    base = tmp_path_factory.mktemp("docs")
    repo = base / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORE)
    bin_dir = base / "bin"
    bin_dir.mkdir()
    for name, body in {"allocopt": f'exec {shlex.quote(sys.executable)} -m allocopt "$@"\n',
                       "python": f'exec {shlex.quote(sys.executable)} "$@"\n',
                       "python3": f'exec {shlex.quote(sys.executable)} "$@"\n'}.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(repo), "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1"}
    return {"repo": repo, "env": env}


def test_pages_have_blocks():
    assert {b.page.name for b in ALL} >= {"README.md", "techniques.md", "mechanism.md", "throughput.md",
                                            "embed-engine.md", "write-a-policy.md"}
    assert sum(b.skip is None for b in ALL) >= 15, "most blocks run"
    for b in ALL:
        if b.skip is not None:
            assert len(b.skip) > 10, f"{b.where}: say why the block cannot run in CI"


RUNNER = """
import sys, traceback
sys.argv = ["doc"]
namespace = {"__name__": "__main__"}
for where, code in BLOCKS:
    try:
        exec(compile(code, where, "exec"), namespace)
    except BaseException:
        print(f"\\nthe block at {where} raised:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
print("ran", len(BLOCKS), "blocks")
"""


def _python_pages() -> list:
    pages = {}
    for b in ALL:
        if b.language == "python":
            pages.setdefault(b.page, []).append(b)
    return [pytest.param(page, bs, id=str(page.relative_to(ROOT))) for page, bs in pages.items()]


@pytest.mark.parametrize("page, page_blocks", _python_pages())
def test_python_blocks(page, page_blocks, scratch):
    run = [b for b in page_blocks if b.skip is None]
    if not run:
        pytest.skip("; ".join(f"{b.where}: {b.skip}" for b in page_blocks))
    env = dict(scratch["env"])
    for b in run:
        env.update(b.env)
    # blank lines in front, so that tracebacks give the line numbers of the page
    script = f"BLOCKS = {[(str(b.page.relative_to(ROOT)), chr(10) * b.line + b.code) for b in run]!r}\n" + RUNNER
    proc = subprocess.run([sys.executable, "-c", script], cwd=scratch["repo"], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"ran {len(run)} blocks" in proc.stdout


@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in ALL if b.language == "sh"])
def test_shell_block(block, scratch):
    if block.skip is not None:
        pytest.skip(f"{block.where}: {block.skip}")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=scratch["repo"],
                          env={**scratch["env"], **block.env}, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{block.where}:\n{block.code}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n" \
                                 f"{proc.stderr[-4000:]}"


def test_site_builds_without_warnings(scratch, tmp_path):
    """mkdocs build --strict: every page, link and API reference resolves (notebooks rendered unexecuted:
    tests/test_notebooks.py executes them; .ci/docs.sh builds the site with their outputs)."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    for plugin in ("material", "mkdocstrings_handlers.python", "mkdocs_jupyter"):
        pytest.importorskip(plugin, reason="the docs extra is not installed: pip install -e '.[docs]'")
    repo = scratch["repo"]
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=repo, env={**scratch["env"], "ALLOCOPT_DOCS_EXECUTE": "false",
                                         "NO_MKDOCS_2_WARNING": "1"},
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    site = tmp_path / "site"
    for page in ("index.html", "changelog/index.html", "reference/api/core/index.html", "reference/cli/index.html",
                 "reference/results/index.html", "how-to/reproduce-gavel/index.html",
                 "explanation/formulations/index.html", "notebooks/01-quickstart/index.html"):
        assert (site / page).is_file(), page
    api = (site / "reference" / "api" / "core" / "index.html").read_text(encoding="utf-8")
    assert "from_json" in api and "GoodputProblem" in api
    home = (site / "index.html").read_text(encoding="utf-8")  # the README, its links pointing into the site
    assert "What it can do" in home and 'href="how-to/embed-engine/"' in home


# ----- the documentation states what is -------------------------------------------------------------
HISTORY_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "docs").rglob("*.py")),
                 ROOT / "benchmarks" / "README.md", *sorted((ROOT / "benchmarks").glob("*.py")),
                 ROOT / "examples" / "README.md"]
ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            r"fourteenth|fifteenth|\d+(?:st|nd|rd|th)")
#: Development history: work logs, session narrative, before/after stories (history belongs in git and the
#: CHANGELOG). Each pattern with what it catches.
HISTORY = [
    (re.compile(rf"\b(?:{ORDINALS})\s+session\b", re.I), "a numbered work session"),
    (re.compile(r"\b(?:this|that|same|previous|earlier|last|next|later)\s+session\b", re.I), "a work session"),
    (re.compile(r"\bsession\s+\d+\b", re.I), "a numbered work session"),
    (re.compile(r"^#{1,6}\s.*\b20\d\d-\d\d(?:-\d\d)?\b", re.M), "a dated heading (a work-log entry)"),
    (re.compile(r"\b20\d\d-\d\d-\d\d\b"), "a date (when something was done belongs in git)"),
    (re.compile(r"\bbefore\s*/\s*after\b", re.I), "a before/after story"),
    (re.compile(r"\|\s*before\s*\|\s*(?:now|after)\s*\|", re.I), "a before/now table"),
    (re.compile(r"\bwe (?:fixed|changed|found|added|removed|replaced)\b", re.I), "a story of the work"),
    (re.compile(r"\bpreviously\b", re.I), "a story of earlier code"),
    (re.compile(r"\bthe code before\b|\bthe earlier default\b|\bthe default before\b", re.I),
     "a story of earlier code"),
]
#: Rendered benchmark results carry the date of their run (metadata of the numbers, not history).
RENDERED = re.compile(r"<!-- results: [^>]*-->.*?<!-- /results -->", re.S)


def _prose(path: Path) -> str:
    """The text of a page (a notebook's cell sources, not its outputs; rendered results left out)."""
    if path.suffix == ".ipynb":
        import json

        return "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text(encoding="utf-8"))["cells"])
    text = path.read_text(encoding="utf-8")
    if path == ROOT / "docs" / "reference" / "results.md":
        return ""  # every line of it is rendered results, with their run's date
    return RENDERED.sub("", text)


@pytest.mark.parametrize("path", [pytest.param(p, id=str(p.relative_to(ROOT)))
                                  for p in [*HISTORY_PAGES, *sorted((ROOT / "notebooks").glob("*.ipynb"))]])
def test_no_development_history(path):
    text = _prose(path)
    found = []
    for pattern, what in HISTORY:
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {what}: {m.group(0)!r}")
    assert not found, "state what is and the command that reproduces it:\n" + "\n".join(found)


def test_history_patterns_catch_work_logs():
    """The patterns above find the obvious forms (and leave process sessions and HTTP sessions alone)."""
    def caught(text: str) -> bool:
        return any(pattern.search(text) for pattern, _ in HISTORY)

    for text in ("On the final code of the ninth session, 18 minutes", "measured this session", "## 2026-11-27 runs",
                 "(2 cores, load 2-4, 2026-11-26)", "| run | before | now |", "We fixed the tie break",
                 "Previously the default was simplex", "12th session: 0 failures", "see session 4"):
        assert caught(text), text
    for text in ("each rank in its own session", "## A session", "`start_new_session=True`",
                 "the job finishes earlier than on its own share", "before training again"):
        assert not caught(text), text


# ----- every documented command parses --------------------------------------------------------------
def _commands(block: Block) -> list[list[str]]:
    """The ``allocopt ...`` (and ``python -m allocopt ...``) command lines of a shell block, as argv lists
    without the program name."""
    code = re.sub(r"\\\n\s*", " ", block.code)
    out = []
    for line in code.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:  # an unbalanced quote
            raise AssertionError(f"{block.where}: cannot split {line!r}: {exc}") from exc
        command: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", "||", "|", ";", "&"):
                for k, w in enumerate(command):
                    if w.endswith("/allocopt") or w == "allocopt":
                        out.append(command[k + 1:])
                        break
                    if w == "-m" and command[k + 1:k + 2] == ["allocopt"]:
                        out.append(command[k + 2:])
                        break
                command = []
            else:
                command.append(word)
    return out


DOCUMENTED = [(b, argv) for b in ALL if b.language == "sh" for argv in _commands(b)]


def test_documented_commands_are_found():
    commands = {argv[0] for _, argv in DOCUMENTED if argv}
    assert {"solve", "simulate", "run", "demo", "bench"} <= commands, commands


@pytest.mark.parametrize("block, argv", [pytest.param(b, a, id=f"{b.where}:{' '.join(a[:2])}")
                                         for b, a in DOCUMENTED])
def test_documented_command_parses(block, argv, monkeypatch, capsys):
    """Every ``allocopt`` command in a code block of the README or the docs (those that cannot run here
    too) is one the command line accepts."""
    from allocopt.cli import _parser

    monkeypatch.chdir(ROOT)
    command = next((arg for arg in argv if not arg.startswith("-")), None)  # as allocopt.cli.main builds it
    try:
        _parser(command).parse_args(argv)
    except SystemExit as exc:  # --help and --version exit 0; a rejected command exits 2
        assert exc.code == 0, f"{block.where}: allocopt {' '.join(argv)}\n{capsys.readouterr().err}"


# ----- generated pages are current ------------------------------------------------------------------
def test_cli_reference_is_current():
    """docs/reference/cli.md has every command and option of the parser (argparse's wording varies with the
    Python version, so the text itself is compared only by ``python docs/cli_reference.py --check``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "docs" / "cli_reference.py")
    cli_reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli_reference)
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    missing = []
    for path, parser in cli_reference.commands():
        heading = f"`{' '.join(path)}`"
        found = re.search(rf"^#+ {re.escape(heading)}$", page, re.M)
        if found is None:
            missing.append(heading)
            continue
        section = page[found.end():].split("\n#", 1)[0]
        missing += [f"{heading} {option}" for action in parser._actions for option in action.option_strings
                    if option not in section]
    assert not missing, "run python docs/cli_reference.py; missing: " + ", ".join(missing)


def test_rendered_results_are_current():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "render.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr


def test_results_files_say_where_their_numbers_come_from():
    import json

    files = sorted((ROOT / "benchmarks" / "results").rglob("*.json"))
    assert files, "benchmarks/results/ holds the results the docs render"
    for path in files:
        doc = json.loads(path.read_text(encoding="utf-8"))
        assert {"format", "benchmark", "allocopt_version", "date", "command", "machine", "tables"} <= set(doc), path
        assert {"cpu", "cpus_usable", "load_average", "versions"} <= set(doc["machine"]), path
        assert doc["command"].startswith(("python ", "allocopt ")), path
        for table in doc["tables"]:
            assert all(len(row) == len(table["columns"]) for row in table["rows"]), (path, table["title"])


def test_every_benchmark_script_writes_results():
    """Each benchmark and conformance script records its results (allocopt.bench.output.write_results, or
    through allocopt bench, which does)."""
    helpers = {"conformance_table.py", "render.py"}
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        if script.name in helpers:
            continue
        source = script.read_text(encoding="utf-8")
        assert "write_results(" in source or "allocopt.bench.cli import run" in source, script.name


def test_write_results_records_the_run(tmp_path):
    from allocopt import __version__
    from allocopt.bench.output import Column, command_line, results_table, write_results

    table = results_table("t", [{"n": 1024, "s": 0.5}, {"n": 2048, "s": None}],
                          [Column("n", "jobs", ","), Column("s", "seconds", ".2f")])
    assert table == {"title": "t", "columns": ["jobs", "seconds"], "rows": [["1,024", "0.50"], ["2,048", "-"]]}
    path = write_results(tmp_path / "sub" / "x.json", "x", tables=[table], data={"rows": [1, 2]},
                         command="python benchmarks/x.py --repeat 3")
    import json

    doc = json.loads(path.read_text())
    assert doc["allocopt_version"] == __version__ and doc["benchmark"] == "x" and doc["rows"] == [1, 2]
    assert doc["command"] == "python benchmarks/x.py --repeat 3" and doc["date"].startswith("20")
    assert "cpu" in doc["machine"] and doc["tables"] == [table]
    with pytest.raises(ValueError, match="date"):
        write_results(tmp_path / "y.json", "y", data={"date": "then"})
    assert command_line(["/usr/bin/allocopt", "bench", "--quick"]) == "allocopt bench --quick"
    assert command_line([str(ROOT / "allocopt" / "bench" / "__main__.py"), "--quick"]) == \
        "python -m allocopt.bench --quick"
    assert command_line([str(ROOT / "allocopt" / "__main__.py"), "solve", "a b.json"]) == "allocopt solve 'a b.json'"


def test_changelog_is_grouped_by_release():
    """CHANGELOG.md: an Unreleased section on top, then one heading per release, the package's own version
    among them (pyproject.toml)."""
    from allocopt import __version__

    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert headings[0] == "Unreleased", headings
    assert __version__ in headings, (__version__, headings)
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert version and version.group(1) == __version__
