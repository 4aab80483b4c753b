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
    assert {b.page.name for b in ALL} >= {"README.md", "formulations.md", "mechanism.md", "throughput.md",
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
    for page in ("index.html", "overview/index.html", "changelog/index.html", "api/core/index.html",
                 "notebooks/01-quickstart/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "core" / "index.html").read_text(encoding="utf-8")
    assert "from_json" in api and "GoodputProblem" in api
