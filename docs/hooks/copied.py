"""An mkdocs hook: files kept outside docs/ that pages show, added to the site as they are at build time.

bench/RESULTS.md is the benchmarks' own record; the site shows it whole (Benchmarks > All results),
so the page cannot drift from the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]

# Where each file appears in the site: a path as if it were under docs/.
TEXT_FILES = {"benchmarks/results.md": ROOT / "bench" / "RESULTS.md"}
BINARY_FILES = {"fl/sync_vs_async.png": ROOT / "bench" / "sync_vs_async.png"}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for uri, source in TEXT_FILES.items():
        files.append(File.generated(config, uri, content=source.read_text(encoding="utf-8")))
    for uri, source in BINARY_FILES.items():
        files.append(File.generated(config, uri, abs_src_path=str(source)))
    return files


def on_serve(server: Any, config: MkDocsConfig, builder: Any) -> Any:
    """`mkdocs serve` rebuilds when a copied file changes."""
    for source in (*TEXT_FILES.values(), *BINARY_FILES.values()):
        server.watch(str(source))
    return server
