"""Certificate folders for tests, made by the same code as ``python -m certs``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from certs.issue import Pair, load_pair
from certs.plan import make_plan
from certs.renew import reconcile
from certs.store import read_files, write_files
from cluster.clock import SystemClock


@dataclass(frozen=True, slots=True)
class Material:
    """A folder as `python -m certs --dns localhost --ip 127.0.0.1` leaves it."""

    folder: Path

    def __getitem__(self, name: str) -> Path:
        return self.folder / name

    def ca(self) -> Pair:
        return load_pair(self["ca.crt"].read_bytes(), self["ca.key"].read_bytes())


def make_material(folder: Path) -> Material:
    plan = make_plan(dns=["localhost"], ips=["127.0.0.1"])
    outcome = reconcile({}, plan, SystemClock().now())
    write_files(folder, outcome.files, read_files(folder, ()))
    return Material(folder)
