"""The lines that end `fedqueue run`: the store that holds the run and the commands that show it, as typed here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fedqueue.cli.launch import fedqueue_command, store_name


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder with `.venv/bin/fedqueue` beside the Python running, and nothing on PATH."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "fedqueue").write_text("#!/bin/sh\n")
    (bin_dir / "fedqueue").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    return bin_dir


def test_fedqueue_is_named_by_its_venv_path_when_path_does_not_find_it(venv: Path, tmp_path: Path) -> None:
    assert fedqueue_command() == ".venv/bin/fedqueue"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(elsewhere)
        assert fedqueue_command() == str(venv / "fedqueue")


def test_fedqueue_is_named_plainly_when_path_finds_this_one(venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(venv))
    assert fedqueue_command() == "fedqueue"


def test_a_fedqueue_on_path_that_is_another_one_is_not_taken_for_this_one(
    venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "fedqueue").write_text("#!/bin/sh\n")
    (other / "fedqueue").chmod(0o755)
    monkeypatch.setenv("PATH", str(other))
    assert fedqueue_command() == ".venv/bin/fedqueue"


def test_the_store_is_named_by_its_file_or_its_url_without_password() -> None:
    assert store_name("sqlite:///fedqueue.db") == "fedqueue.db"
    assert store_name("sqlite:////srv/runs/fedqueue.db") == "/srv/runs/fedqueue.db"
    assert store_name("postgresql+psycopg://fq:secret@db:5432/fq") == "postgresql+psycopg://fq:***@db:5432/fq"
