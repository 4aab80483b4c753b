#!/usr/bin/env bash
# CI step: build the documentation site (mkdocs.yml) with warnings as errors, executing the notebooks.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv && .venv/bin/pip install -q -e '.[docs]' && .venv/bin/mkdocs build --strict
