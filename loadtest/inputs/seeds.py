"""The seeds a study runs, as people write them on the command line.

Layer: PURE (text in, numbers out). Must not read files or draw random numbers: the
studies (``loadtest.placement``, ``loadtest.reservations``) seed their own generators.
"""

from __future__ import annotations


def parse_seeds(text: str) -> tuple[int, ...]:
    """``42-51`` or ``42,45``."""
    seeds: list[int] = []
    for part in text.split(","):
        low, sep, high = part.partition("-")
        seeds.extend(range(int(low), int(high) + 1) if sep else [int(low)])
    return tuple(seeds)
