"""The documentation site: built with --strict, its reference pages complete against the code, its home page
rendered in headless Chromium.

The site is built once into a temporary folder (a few seconds). The reference tables are generated from the code
by docs/hooks/reference.py; these tests read them back from the built HTML and hold them to what the code has,
so a new run-config field, `dfkd` knob or setting without a description fails here (and the build itself).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedqueue.config import Settings
from fedqueue.fl.config import RunConfig, config_sections
from tests.support.service_support import required_tool

ROOT = Path(__file__).resolve().parents[2]


class _Tables(HTMLParser):
    """Every table of a page: rows of cell texts, the header row first."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _tables(page: Path, first_header: str) -> dict[str, list[str]]:
    """Every table of `page` whose first column is headed `first_header`: their rows by their first cell."""
    parser = _Tables()
    parser.feed(page.read_text(encoding="utf-8"))
    return {
        row[0]: row for rows in parser.tables if rows and rows[0] and rows[0][0] == first_header for row in rows[1:]
    }


def _table(page: Path, first_header: str) -> dict[str, list[str]]:
    """The table of `page` whose first column is headed `first_header`: its rows by their first cell."""
    parser = _Tables()
    parser.feed(page.read_text(encoding="utf-8"))
    for rows in parser.tables:
        if rows and rows[0] and rows[0][0] == first_header:
            return {row[0]: row for row in rows[1:]}
    raise AssertionError(f"{page.name}: no table headed {first_header!r}")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built as `make docs` builds it, into a folder of its own."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def test_run_config_reference_lists_every_field_with_a_description(site: Path) -> None:
    rows = _tables(site / "reference" / "run-config.html", "key")
    keys = [key for _, _, section_keys in config_sections() for key in section_keys]
    assert set(rows) == set(keys) == set(RunConfig().to_dict())
    for name, (_, type_words, default, meaning) in rows.items():
        assert meaning, f"{name}: no description"
        assert type_words and default, name
    # The tables' order is the code's, so related knobs stay together.
    assert list(rows) == keys


def test_dfkd_reference_lists_every_knob_with_its_default_and_a_description(site: Path) -> None:
    # torch: the dfkd knobs' home imports it; the docs build reads that module's source instead.
    from fedqueue.fl.ml.distill import dfkd_defaults

    rows = _table(site / "reference" / "run-config.html", "dfkd key")
    defaults = dfkd_defaults()
    assert list(rows) == list(defaults)
    for name, (_, _, default, meaning) in rows.items():
        assert meaning, f"dfkd.{name}: no description"
        value = defaults[name]
        assert default == (json.dumps(value) if isinstance(value, str) else repr(value)), name


class _Asked(dict[str, str]):
    """An empty environment that notes the variables read from it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return default


def test_settings_reference_lists_every_variable_and_field_with_a_description(site: Path) -> None:
    rows = _table(site / "reference" / "settings.html", "variable")
    environment = _Asked()
    Settings.from_env(environment)
    assert environment.asked, "Settings.from_env read no variable"
    listed = {name for variables in rows for name in variables.split(", ")}
    assert listed == environment.asked
    assert {row[1] for row in rows.values()} == {spec.name for spec in dataclasses.fields(Settings)}
    for variables, (_, _, default, meaning) in rows.items():
        assert meaning and default, variables


def test_cli_reference_lists_every_command_and_option(site: Path) -> None:
    import typer.main

    from fedqueue.cli.commands import app

    page = (site / "reference" / "cli.html").read_text(encoding="utf-8")

    def walk(path: str, command: Any) -> None:
        assert f'id="{path.replace(" ", "-")}"' in page, f"{path}: no section"
        for param in command.params:
            if param.param_type_name == "option" and not param.hidden:
                for name in param.opts:
                    assert f"<code>{name}</code>" in page, f"{path} {name}: not listed"
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.hidden:
                walk(f"{path} {name}", sub)

    walk("fedqueue", typer.main.get_command(app))


def _nav_titles(nav: list[Any]) -> list[str]:
    titles = []
    for entry in nav:
        for title, target in entry.items():
            titles.append(title)
            if isinstance(target, list):
                titles += _nav_titles(target)
    return titles


def test_home_page_renders_in_a_browser_with_its_nav(site: Path, tmp_path: Path) -> None:
    from tests.support.browser import Browser

    chromium = required_tool("chromium", "chromium", "the documentation site in a browser")
    expected = _nav_titles(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    browser = Browser(chromium, tmp_path / "chromium")
    try:
        # Opened from the file itself, as `make docs` tells a reader to.
        browser.open((site / "index.html").as_uri())
        shown = browser.call(
            "Runtime.evaluate",
            expression="""JSON.stringify({
                title: document.title,
                heading: document.querySelector('h1') ? document.querySelector('h1').textContent : '',
                nav: Array.from(document.querySelectorAll('nav.md-nav--primary .md-nav__link'))
                    .map(link => link.textContent.trim()),
                header: getComputedStyle(document.querySelector('.md-header')).position,
            })""",
            returnByValue=True,
        )
    finally:
        browser.close()
    page = json.loads(shown["result"]["value"])
    assert page["title"].endswith("fedqueue"), page["title"]
    assert page["heading"].startswith("Getting started")
    missing = [title for title in expected if title not in page["nav"]]
    assert not missing, f"nav entries missing from the page: {missing} (found {page['nav']})"
    # The theme's stylesheet applied (a file:// page that loads no CSS still has its text).
    assert page["header"] == "sticky"
