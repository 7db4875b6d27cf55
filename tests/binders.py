"""Binders for tests: our own seam (``extender.binder.Binder``), faked.

Layer: test support. ``GatedBinder`` holds every bind until told to go on, so a test
can act while a bind is under way without racing a timer; ``FailingBinder`` fails every
bind the way kube-apiserver or a broken connection would.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from extender.binder import Binder, BindError, Placement


@dataclass
class GatedBinder:
    """Holds every bind until ``release`` is set, then hands it to ``behind``."""

    behind: Binder
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[Placement] = field(default_factory=list)

    async def bind(self, placement: Placement) -> None:
        self.calls.append(placement)
        self.entered.set()
        await self.release.wait()
        await self.behind.bind(placement)


@dataclass
class FailingBinder:
    """Every bind fails; ``uncertain`` as when the connection broke mid-bind."""

    uncertain: bool

    async def bind(self, placement: Placement) -> None:
        raise BindError(f"cannot bind pod {placement.pod.key}: injected", uncertain=self.uncertain)
