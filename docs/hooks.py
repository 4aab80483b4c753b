"""MkDocs hooks: pages that live outside docs/ (the README, the changelog, the notebooks).

- ``index.md`` (the home page) is the top-level README.md and ``changelog.md`` CHANGELOG.md,
  their links rewritten for the site (``docs/X.md`` -> ``X.md``);
- ``notebooks/*.ipynb`` are the notebooks of the repository, rendered (and executed)
  by mkdocs-jupyter, so this hook runs before it;
- links from docs/ to ``../README.md`` and ``../CHANGELOG.md`` point at those pages.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
GENERATED = {"index.md": ROOT / "README.md", "changelog.md": ROOT / "CHANGELOG.md"}


@event_priority(100)  # before mkdocs-jupyter turns .ipynb files into pages
def on_files(files: Files, config) -> Files:
    for uri, path in GENERATED.items():
        text = re.sub(r"\]\(docs/", "](", path.read_text(encoding="utf-8")).replace("](CHANGELOG.md", "](changelog.md")
        files.append(File.generated(config, uri, content=text))
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):  # a real file, as mkdocs-jupyter reads it
        files.append(File(f"notebooks/{notebook.name}", src_dir=str(ROOT), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Links from a page under docs/ to the top-level README and CHANGELOG point at their site pages."""
    depth = page.file.src_uri.count("/")
    up = "../" * (depth + 1)
    home = "../" * depth
    return (markdown.replace(f"]({up}README.md", f"]({home}index.md")
            .replace(f"]({up}CHANGELOG.md", f"]({home}changelog.md"))
