"""A compiled module older than its source is found, so no run hides an edit."""

from __future__ import annotations

import os
from pathlib import Path

from server import compiled

SO = "patch.cpython-311-x86_64-linux-gnu.so"


def _tree(tmp_path: Path, *, source_newer: bool) -> Path:
    package = tmp_path / "webhook"
    package.mkdir()
    source, built = package / "patch.py", package / SO
    source.write_text("x = 1\n")
    built.write_bytes(b"\x7fELF")
    older, newer = (built, source) if source_newer else (source, built)
    os.utime(older, (1_000_000, 1_000_000))
    os.utime(newer, (2_000_000, 2_000_000))
    return tmp_path


def test_a_source_edited_after_its_build_is_named(tmp_path: Path) -> None:
    root = _tree(tmp_path, source_newer=True)
    assert compiled.stale(root) == ["webhook/patch.py"]
    assert "webhook/patch.py" in compiled.stale_message(compiled.stale(root))
    assert "make compiled" in compiled.stale_message(["webhook/patch.py"])


def test_a_build_newer_than_its_source_is_fresh(tmp_path: Path) -> None:
    assert compiled.stale(_tree(tmp_path, source_newer=False)) == []


def test_sources_alone_are_fresh(tmp_path: Path) -> None:
    (tmp_path / "webhook").mkdir()
    (tmp_path / "webhook" / "patch.py").write_text("x = 1\n")
    assert compiled.stale(tmp_path) == []


def test_this_checkout_is_fresh() -> None:
    # what the suite's session start checks too: make test rebuilt what changed
    assert compiled.stale() == []
