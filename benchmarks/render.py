"""Render the benchmark results files into the documentation.

Every script in ``benchmarks/`` writes its results file to ``benchmarks/results/NAME.json``
(``allocopt.bench.output.write_results``: allocopt's version, the machine, the date, the command line,
the run's tables). This command turns those files into:

- ``docs/reference/results.md``: one section per results file, with the command that reproduces it,
  the machine, the date and its tables;
- every region of a page under ``docs/`` between ``<!-- results: NAME -->`` (or
  ``<!-- results: NAME TABLE-TITLE -->``, one table of the file) and ``<!-- /results -->``: the tables
  of ``benchmarks/results/NAME.json``, with a line naming the command.

Run: ``python benchmarks/render.py`` (``--check``: change nothing, exit 1 and name the files that
are out of date).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
PAGE = DOCS / "reference" / "results.md"
REGION = re.compile(r"(<!-- results: (?P<name>[\w./-]+)(?: (?P<title>[^>]*?))? -->\n)(?P<body>.*?)(<!-- /results -->)",
                    re.DOTALL)
HEADER = """# Benchmark results

Rendered by `python benchmarks/render.py` from the results files in `benchmarks/results/`, which the
benchmark scripts write (see [benchmarks](bench.md)); rerun a section's command, then the render
command, to regenerate it on your machine. Times depend on the machine and on what else runs on it
(the load average is recorded at the start and end of each run): compare ratios measured in the same
run, not seconds across machines.
"""


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(table: dict[str, Any]) -> str:
    """One results table as a Markdown table (numbers right-aligned)."""
    columns = table["columns"]
    rows = table["rows"]
    numeric = [all(re.fullmatch(r"[-+~>=<]*[\d.,]+(e[-+]?\d+)?\s*[a-z%x]*|-", str(r[i])) for r in rows) if rows
               else False for i in range(len(columns))]
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def provenance(doc: dict[str, Any], name: str) -> str:
    """Where a results file's numbers come from: the command, allocopt's version, the date, the machine."""
    m = doc.get("machine", {})
    load = m.get("load_average")
    end = m.get("load_average_end")
    load_text = f"load average {load[0]:g}" if load else "load average unknown"
    if end:
        load_text += f" at the start, {end[0]:g} at the end"
    cores = m.get("cpus_usable") or m.get("cpu_count")
    return (f"`{doc['command']}` (`benchmarks/results/{name}.json`): allocopt {doc.get('allocopt_version')}, "
            f"{doc.get('date', '')[:10]}, {m.get('cpu') or m.get('machine')}, {cores} cores, "
            f"{m.get('memory_gib')} GiB, {m.get('python')}, {load_text}.")


def tables_markdown(doc: dict[str, Any], title: str | None = None) -> str:
    tables = [t for t in doc.get("tables", []) if title is None or t["title"] == title]
    if title is not None and not tables:
        raise SystemExit(f"benchmarks/results/{doc['benchmark']}.json has no table titled {title!r}")
    parts = []
    for t in tables:
        if title is None and t.get("title"):
            parts.append(f"**{t['title']}**\n")
        parts.append(markdown_table(t) + "\n")
        for note in t.get("notes", []):
            parts.append(note + "\n")
    return "\n".join(parts)


def load_results() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(RESULTS.rglob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("format") != 1 or "command" not in doc:
            raise SystemExit(f"{path.relative_to(ROOT)}: not a results file (allocopt.bench.output.write_results)")
        out[path.relative_to(RESULTS).with_suffix("").as_posix()] = doc
    return out


def results_page(results: dict[str, dict[str, Any]]) -> str:
    parts = [HEADER]
    for name, doc in results.items():
        parts.append(f"## {name}\n\n{provenance(doc, name)}\n\n{tables_markdown(doc)}")
    return "\n".join(parts).rstrip() + "\n"


def render_regions(text: str, results: dict[str, dict[str, Any]], where: str) -> str:
    def replace(m: re.Match) -> str:
        name = m.group("name")
        if name not in results:
            raise SystemExit(f"{where}: no benchmarks/results/{name}.json for its results region")
        doc = results[name]
        body = f"\n{tables_markdown(doc, m.group('title'))}\nFrom {provenance(doc, name)}\n\n"
        return m.group(1) + body + m.group(5)
    return REGION.sub(replace, text)


def rendered() -> dict[Path, str]:
    """Every file this command writes, with its new text."""
    results = load_results()
    out = {PAGE: results_page(results)}
    for page in sorted(DOCS.rglob("*.md")):
        if page == PAGE:
            continue
        text = page.read_text(encoding="utf-8")
        if "<!-- results: " in text:
            out[page] = render_regions(text, results, str(page.relative_to(ROOT)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in rendered().items():
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == text:
            continue
        stale.append(str(path.relative_to(ROOT)))
        if not args.check:
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print("out of date (run python benchmarks/render.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    for name in stale:
        print(f"rendered {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
