"""What every integration module shares: its leaks are its own failures.

Layer: ROOT (of the integration suite). A socket, transport or server that a test leaves
open is found by the garbage collector whenever it next runs: maybe during another
module's test, where ``filterwarnings = error`` turns the ResourceWarning into that
test's error, maybe only after the last test, where it fails nothing. Collecting at the
end of each module makes it fail the module that leaked it, every run. The extender's
tests freeze the heap (as the server does once its informers have listed), which hides
garbage from the collector, so the heap is unfrozen first."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def _leaks_fail_the_module_that_made_them() -> Iterator[None]:
    yield
    gc.unfreeze()
    gc.collect()
