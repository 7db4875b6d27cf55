"""The e2e session: one real control plane with Tessera installed, shared by every scenario.

Layer: ROOT (of the e2e suite; it must not hold scenario logic). Finds the pinned
binaries (skipping the e2e tests, and nothing else, when there are none and no Go to build
them), brings the cluster up once per session (``loadtest/stack/cluster.py``) and
always tears it down: at the end of the session, on Ctrl-C or SIGTERM, and from ``atexit``
if all else fails.
"""

from __future__ import annotations

import atexit
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import pytest

from cluster.clock import SystemClock
from loadtest.stack.cluster import EXTENDER_MISSING, E2ECluster, bring_up
from loadtest.stack.controlplane import (
    BinariesUnavailableError,
    find_binaries,
    find_crds,
    find_jobset,
    find_kueue,
)

HOW_TO_GET_BINARIES = (
    "no Kubernetes control-plane binaries: set KUBEBUILDER_ASSETS to a folder holding etcd, "
    "kube-apiserver, kube-scheduler, kube-controller-manager and kubectl (v1.36), or install "
    "Go >= 1.26 and run tests/e2e/build_binaries.sh (and its modes crds, kueue and jobset)"
)

log = logging.getLogger(__name__)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # pytest tears fixtures down on KeyboardInterrupt; SIGTERM's default would not.
    raise KeyboardInterrupt


@dataclass(frozen=True, slots=True)
class Assets:
    binaries: Path | None
    crds: Path | None
    kueue: Path | None
    jobset: Path | None
    missing: str = ""


@pytest.fixture(scope="session")
def assets(request: pytest.FixtureRequest) -> Assets:
    """The pinned binaries and CRDs, looked up once per session (a fixture that skips is
    run again for every test, so the lookup and its message live here)."""
    # A cold cache means a build of several minutes: let its progress reach the terminal.
    capture = request.config.pluginmanager.getplugin("capturemanager")
    try:
        with capture.global_and_fixture_disabled():
            return Assets(
                find_binaries(progress=sys.stderr),
                find_crds(progress=sys.stderr),
                find_kueue(progress=sys.stderr),
                find_jobset(progress=sys.stderr),
            )
    except BinariesUnavailableError as exc:
        # The script's full explanation went to the terminal above; the skip reason, which
        # pytest repeats per test module, keeps to one line.
        why = str(exc).splitlines()[0].split("] ", 1)[-1] if str(exc) else "unavailable"
        return Assets(None, None, None, None, f"{HOW_TO_GET_BINARIES} (build_binaries.sh: {why})")


@pytest.fixture(scope="session")
def e2e(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2ECluster]:
    if (
        assets.binaries is None
        or assets.crds is None
        or assets.kueue is None
        or assets.jobset is None
    ):
        pytest.skip(assets.missing)
    binaries, crds, kueue, jobset = assets.binaries, assets.crds, assets.kueue, assets.jobset
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main else None
    try:
        cluster = bring_up(
            binaries,
            crds,
            kueue,
            jobset,
            workdir=tmp_path_factory.mktemp("e2e"),
            clock=SystemClock(),
        )
        atexit.register(cluster.stop)
        try:
            yield cluster
        finally:
            cluster.stop()
            atexit.unregister(cluster.stop)
            log.info("e2e logs kept in %s", cluster.workdir / "logs")
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


@pytest.fixture(autouse=True)
def _jobs_deleted_after(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each scenario leaves the quota and the GPUs as it found them: with the real Kueue,
    a job left behind would hold both for the scenarios after it."""
    yield
    if "e2e" in request.fixturenames:
        cluster: E2ECluster = request.getfixturevalue("e2e")
        cluster.delete_jobs()


@pytest.fixture
def scheduling(e2e: E2ECluster) -> E2ECluster:
    """The cluster, for scenarios that need kube-scheduler calling the extender."""
    if e2e.extender is None:
        pytest.skip(EXTENDER_MISSING)
    return e2e
