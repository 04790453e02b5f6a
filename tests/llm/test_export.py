"""Writing an export file: whole or not at all, with the permissions any new file gets."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedqueue.errors import ConfigError
from fedqueue.llm.export import write_atomically


@pytest.fixture
def umask_027() -> Iterator[None]:
    previous = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_gets_the_umask_and_a_replaced_file_keeps_its_mode(tmp_path: Path, umask_027: None) -> None:
    out = tmp_path / "out.jsonl"
    write_atomically(out, "one\n")
    assert out.read_text() == "one\n" and mode(out) == 0o640  # 0666 less the umask, not mkstemp's 0600
    out.chmod(0o604)
    write_atomically(out, "two\n")
    assert out.read_text() == "two\n" and mode(out) == 0o604
    assert os.listdir(tmp_path) == ["out.jsonl"]  # nothing left beside it


def test_a_failed_write_leaves_the_old_file_and_nothing_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")

    def full_disk(source: object, target: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)  # the os.replace write_atomically calls
    with pytest.raises(ConfigError, match=r"^out .*out\.jsonl: cannot write it \(No space left on device\)$"):
        write_atomically(out, "new\n")
    assert out.read_text() == "old\n" and os.listdir(tmp_path) == ["out.jsonl"]


def test_a_folder_is_no_file_to_write(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a folder; give the name of the file to write"):
        write_atomically(tmp_path, "x\n", "--out")
