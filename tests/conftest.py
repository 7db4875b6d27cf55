"""The whole suite's session: it must test the code as it is now.

``make test`` compiles the webhook's review path first (``make compiled``); a compiled
module older than its source would make every test below run the old code, so the
session stops before the first test, saying which sources changed and what to run.
"""

from __future__ import annotations

import pytest

from server import compiled


def pytest_sessionstart(session: pytest.Session) -> None:
    edited = compiled.stale()
    if edited:
        pytest.exit(compiled.stale_message(edited), returncode=2)
