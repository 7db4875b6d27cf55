"""The fuzz layer's closing summary: one line per property, saying how many inputs it
sent, how many broke a property, the slowest answer and the memory it left behind.

Layer: ROOT (of the fuzz suite; pytest's hooks only)."""

from __future__ import annotations

import pytest

from tests.fuzz.harness import TALLIES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TALLIES:
        return
    terminalreporter.section("fuzz")
    for tally in TALLIES:
        terminalreporter.write_line(tally.line())
    total = sum(t.inputs for t in TALLIES)
    failures = sum(t.failures for t in TALLIES if not t.expected_to_fail)
    expected = sum(t.failures for t in TALLIES if t.expected_to_fail)
    terminalreporter.write_line(
        f"fuzz total: {total} inputs, {failures} failures"
        + (f" (and {expected} in properties marked xfail)" if expected else "")
    )
