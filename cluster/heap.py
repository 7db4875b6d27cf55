"""Keep the garbage collector's pauses short in a server whose heap is a large cache.

Layer: I/O (the interpreter's process-wide collector). Only ``serving.serve`` uses it,
for as long as it serves; must not decide anything or be imported by decision code.

Why: CPython's collector walks, on each full collection, every object that survived the
young collections and was not frozen. The servers' caches are most of the heap, and
their objects are replaced as the cluster changes: a bind makes a new pod, allocation
and node object, and the old ones are freed by reference counting. Without help the
survivors pile up in the oldest generation, and a full pass over them grows with the
churn, towards the whole cache: about 0.6 s at 150,000 pods, every minute or so at 300
binds per second, during which no request is answered.

The policy: what survives a collection of the middle or oldest generation is frozen at
once (``gc.freeze``), so the oldest generation stays nearly empty and its passes take
milliseconds. Frozen objects are still freed by reference counting when the last
reference goes; what the collector no longer finds is a reference cycle among them that
becomes garbage later. The servers make none in steady state: after 12,000 scheduled
pods (filter, prioritize and bind each) a full collection over everything, frozen
included, found nothing to free.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping


def _freeze_survivors(phase: str, info: Mapping[str, int]) -> None:
    # Generation 0 survivors are left to the next young pass: most die within a request.
    if phase == "stop" and info["generation"] >= 1:
        gc.freeze()


@contextlib.contextmanager
def short_pauses() -> Iterator[None]:
    """For the block: freeze what is alive now (what was loaded before serving lives as
    long as the process), then what survives each collection past the youngest."""
    gc.collect()
    gc.freeze()
    gc.callbacks.append(_freeze_survivors)
    try:
        yield
    finally:
        gc.callbacks.remove(_freeze_survivors)
