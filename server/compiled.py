"""Compiled modules older than their sources: a build that would hide an edit.

Layer: I/O (reads the times of the project's files; nothing else). Must not build or
import anything: ``tools/compile.py`` (``make compiled``) compiles the webhook's review
path with mypyc into extension modules beside their sources, which Python then imports
instead of the ``.py``. ``make`` rebuilds them when a source changes; a run that does not
go through make (``pytest`` alone, ``python -m webhook`` after a ``git pull``) would run
the old code without a word. ``serving.run`` and the test session refuse to start then,
naming the modules and the command that fixes it.
"""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Final

PACKAGES: Final = ("cluster", "server", "webhook", "extender")
"""The project's packages whose modules may be compiled (the ones the servers run)."""

FIX: Final = "run `make compiled` to rebuild them, or `make clean-compiled` to run the sources"

_ROOT: Final = Path(__file__).resolve().parent.parent


def stale(root: Path = _ROOT) -> list[str]:
    """The sources under ``root``'s packages edited after their compiled module was built
    (``webhook/patch.py``), sorted; empty when nothing is compiled, as in a wheel."""
    found: list[str] = []
    for package in PACKAGES:
        for suffix in EXTENSION_SUFFIXES:
            for built in (root / package).rglob("*" + suffix):
                source = built.with_name(built.name[: -len(suffix)] + ".py")
                if source.exists() and source.stat().st_mtime > built.stat().st_mtime:
                    found.append(source.relative_to(root).as_posix())
    return sorted(set(found))


def stale_message(sources: list[str]) -> str:
    return f"compiled modules are older than their sources ({', '.join(sources)}): {FIX}"
