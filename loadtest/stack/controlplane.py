"""A real Kubernetes control plane on loopback, for the end-to-end suite.

Layer: I/O (starts processes, writes files, opens sockets). Starts etcd, kube-apiserver,
kube-controller-manager and kube-scheduler as subprocesses, each in its own process group,
with all data, keys and logs in one work folder; stops them all again. It must not decide
anything about Tessera's behaviour, must not reach any address but 127.0.0.1, and must not
leave a process running after ``stop`` (or the ``with`` block) returns.

Binaries and CRDs come from ``tests/e2e/build_binaries.sh`` (see tests/e2e/README.md).
Run ``python -m loadtest.stack.controlplane`` to bring one up by hand until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import secrets
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, Final, Self

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cluster.clock import Clock, SystemClock
from cluster.logs import fields
from loadtest.ports import LOOPBACK, free_port

log = logging.getLogger(__name__)

BUILD_SCRIPT: Final = Path(__file__).resolve().parents[2] / "tests" / "e2e" / "build_binaries.sh"
# Without kubelets the node-lifecycle controller taints every API-created node unreachable
# after about 40 s; everything else (job controller, garbage collector, ...) stays on.
DEFAULT_CONTROLLERS: Final = "*,-node-lifecycle-controller"
_BUILD_SCRIPT_NO_GO: Final = 3
_POLL_SECONDS: Final = 0.2
_STOP_GRACE_SECONDS: Final = 10.0


class BinariesUnavailableError(RuntimeError):
    """No binaries and no Go to build them: the e2e suite skips with this message."""


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become healthy; the message ends with its log."""


def _run_build_script(mode: str, progress: IO[str] | None = None) -> Path:
    """Run the build script; its progress lines (stderr) are echoed to ``progress`` as they
    come, so a cold build (minutes) shows what it is doing instead of looking hung."""
    with subprocess.Popen(
        ["bash", str(BUILD_SCRIPT), mode],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        lines = []
        for line in process.stderr:
            lines.append(line)
            if progress is not None:
                progress.write(line)
                progress.flush()
        out = process.stdout.read()
        code = process.wait()
    errors = "".join(lines).strip()
    if code == _BUILD_SCRIPT_NO_GO:
        raise BinariesUnavailableError(errors)
    if code != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} {mode} failed:\n{errors}")
    return Path(out.strip())


def find_binaries(progress: IO[str] | None = None) -> Path:
    """The folder holding etcd, kube-apiserver, kube-scheduler, kube-controller-manager and
    kubectl. Builds them when the cache is cold (slow: run the script ahead, as CI does);
    the build's progress goes to ``progress``."""
    return _run_build_script("bin", progress)


def find_crds(progress: IO[str] | None = None) -> Path:
    """The folder holding the pinned Kueue (and JobSet) CRD YAMLs."""
    return _run_build_script("crds", progress)


def find_kueue(progress: IO[str] | None = None) -> Path:
    """The folder holding the pinned Kueue manager (``bin/kueue``) and the webhook and
    manager configuration YAMLs of that release (``config/``)."""
    return _run_build_script("kueue", progress)


def find_jobset(progress: IO[str] | None = None) -> Path:
    """The folder holding the pinned JobSet manager (``bin/jobset``) and the webhook
    configuration and ClusterRole YAMLs of that release (``config/``)."""
    return _run_build_script("jobset", progress)


@dataclass(frozen=True, slots=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(free_port(), free_port(), free_port(), free_port(), free_port())


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a client needs to reach the API server as cluster admin (system:masters)."""

    server: str
    token: str
    ca_file: Path
    kubeconfig: Path


@dataclass(slots=True)
class _Component:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def _service_account_key() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        # kube-apiserver reads EC keys only in SEC1 ("EC PRIVATE KEY") form.
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _kubeconfig(server: str, ca_file: Path, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
        "current-context": "e2e",
    }


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _fetch(
    port: int, path: str, *, context: ssl.SSLContext | None, token: str = "", timeout: float = 5
) -> tuple[int, bytes]:
    """A GET on loopback (TLS with ``context``): its status and body. Raises ``OSError``
    or ``http.client.HTTPException`` when nothing answers."""
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection(LOOPBACK, port, timeout=timeout, context=context)
        if context is not None
        else http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _get(port: int, path: str, *, context: ssl.SSLContext | None, token: str = "") -> int:
    """The status of a GET on loopback, 0 when nothing answers yet."""
    try:
        return _fetch(port, path, context=context, token=token)[0]
    except (OSError, http.client.HTTPException):
        return 0


def _unverified_tls() -> ssl.SSLContext:
    # The controller-manager and scheduler serve health on certificates they make up in
    # memory at start; there is nothing to verify them against, and only loopback is asked.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager (+ kube-scheduler) on loopback.

    ``start()`` brings up etcd, the API server and the controller-manager and returns once
    the API server's ``/readyz`` answers 200; it also starts kube-scheduler when given a
    ``scheduler_config``, otherwise call ``start_scheduler`` later (for example once the
    extender it points at is listening). Use as a context manager, or call ``stop()``.
    """

    __slots__ = (
        "_binaries",
        "_clock",
        "_components",
        "_controllers",
        "_ports",
        "_ready_timeout",
        "_scheduler_config",
        "_token",
        "_workdir",
    )

    def __init__(
        self,
        binaries: Path,
        workdir: Path,
        *,
        scheduler_config: Path | None = None,
        controllers: str = DEFAULT_CONTROLLERS,
        ready_timeout: float = 90.0,
        clock: Clock | None = None,
    ) -> None:
        self._binaries = binaries
        self._workdir = workdir
        self._scheduler_config = scheduler_config
        self._controllers = controllers
        self._ready_timeout = ready_timeout
        self._clock: Clock = clock or SystemClock()
        self._ports = Ports.pick()
        self._token = secrets.token_hex(16)
        self._components: list[_Component] = []

    # ------------------------------------------------------------------ public surface

    @property
    def credentials(self) -> Credentials:
        return Credentials(
            server=f"https://{LOOPBACK}:{self._ports.apiserver}",
            token=self._token,
            ca_file=self._workdir / "apiserver-certs" / "apiserver.crt",
            kubeconfig=self._workdir / "admin.kubeconfig",
        )

    @property
    def workdir(self) -> Path:
        return self._workdir

    def pid(self, name: str) -> int | None:
        """The process id of component ``name`` (``etcd``, ``kube-apiserver``...) while it
        runs, for a benchmark that reads its CPU from ``/proc``; None when not running."""
        for component in self._components:
            if component.name == name and component.process.poll() is None:
                return component.process.pid
        return None

    def metrics(self, name: str) -> str:
        """The ``/metrics`` page of ``kube-apiserver`` or ``kube-scheduler``, read as
        cluster admin (for a benchmark that counts requests or scheduling attempts)."""
        if name == "kube-apiserver":
            port, context = (
                self._ports.apiserver,
                ssl.create_default_context(cafile=str(self.credentials.ca_file)),
            )
        elif name == "kube-scheduler":
            port, context = self._ports.scheduler, _unverified_tls()
        else:
            raise ValueError(f"no metrics page for {name!r}")
        status, body = _fetch(port, "/metrics", context=context, token=self._token, timeout=30)
        if status != http.HTTPStatus.OK:
            raise ControlPlaneError(f"{name} /metrics: HTTP {status}")
        return body.decode()

    def start(self) -> None:
        self._workdir.mkdir(parents=True, exist_ok=True)
        (self._workdir / "logs").mkdir(exist_ok=True)
        try:
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig()
            self._start_controller_manager()
            if self._scheduler_config is not None:
                self.start_scheduler(self._scheduler_config)
        except BaseException:
            self.stop()
            raise

    def start_scheduler(self, config: Path, *, kubeconfig: Path | None = None) -> None:
        """Start kube-scheduler with ``config`` (a KubeSchedulerConfiguration), pointed at
        this API server and with leader election off; returns once it is healthy. It acts
        as cluster admin unless given a ``kubeconfig`` (e.g. a ServiceAccount's, to test
        the RBAC an install grants it)."""
        client = str(kubeconfig or self.credentials.kubeconfig)
        document = yaml.safe_load(config.read_text())
        document.setdefault("clientConnection", {})["kubeconfig"] = client
        document.setdefault("leaderElection", {})["leaderElect"] = False
        effective = self._workdir / "kube-scheduler-config.yaml"
        effective.write_text(yaml.safe_dump(document, sort_keys=False))
        port = self._ports.scheduler
        self._spawn(
            "kube-scheduler",
            f"--config={effective}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--authentication-kubeconfig={client}",
            f"--authorization-kubeconfig={client}",
        )
        self._wait_healthy("kube-scheduler", port, "/healthz", _unverified_tls())

    def stop_component(self, name: str) -> None:
        """Stop one component (e.g. ``kube-scheduler`` before starting it with another
        configuration). Unknown or already stopped names are ignored."""
        for component in [c for c in self._components if c.name == name]:
            self._terminate(component)
            self._components.remove(component)

    def stop(self) -> None:
        """Stop every component, newest first; safe to call more than once."""
        while self._components:
            self._terminate(self._components.pop())

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl as cluster admin."""
        return subprocess.run(
            [str(self._binaries / "kubectl"), f"--kubeconfig={self.credentials.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=check,
        )

    def apply_crds(self, folder: Path) -> None:
        """Create the CRDs in ``folder`` and wait until they are served. Server-side apply:
        Kueue's Workload CRD is too large for the last-applied annotation of a client-side
        apply."""
        self.kubectl("apply", "--server-side", f"--filename={folder}")
        self.kubectl(
            "wait",
            "--for=condition=Established",
            f"--timeout={int(self._ready_timeout)}s",
            f"--filename={folder}",
        )

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ components

    def _start_etcd(self) -> None:
        ports = self._ports
        peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
        client = f"http://{LOOPBACK}:{ports.etcd_client}"
        self._spawn(
            "etcd",
            "--name=e2e",
            f"--data-dir={self._workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=e2e={peer}",
            # Throwaway data: fsync only slows the suite down.
            "--unsafe-no-fsync",
            "--log-level=warn",
        )
        self._wait_healthy("etcd", ports.etcd_client, "/health", None)

    def _start_apiserver(self) -> None:
        key = self._workdir / "service-account.key"
        _write_private(key, _service_account_key())
        tokens = self._workdir / "tokens.csv"
        _write_private(tokens, f'{self._token},admin,admin-uid,"system:masters"\n'.encode())
        self.start_apiserver()

    def start_apiserver(self) -> None:
        """Start kube-apiserver (again, after ``stop_component("kube-apiserver")``) with
        the flags, keys and certificates of the first start: the tokens it issued stay
        valid and clients keep trusting it. Returns once its ``/readyz`` answers 200."""
        key = self._workdir / "service-account.key"
        self._spawn(
            "kube-apiserver",
            f"--etcd-servers=http://{LOOPBACK}:{self._ports.etcd_client}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--secure-port={self._ports.apiserver}",
            # A self-signed serving certificate for 127.0.0.1, made at first start.
            f"--cert-dir={self._workdir / 'apiserver-certs'}",
            "--authorization-mode=RBAC",
            f"--token-auth-file={self._workdir / 'tokens.csv'}",
            f"--service-account-key-file={key}",
            f"--service-account-signing-key-file={key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.0.0.0/24",
            # No Endpoints for the `kubernetes` Service: a loopback address is invalid there.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
        )
        # Stopped in its place, before etcd and after the components that need it.
        started = self._components.pop()
        after_etcd = next((i + 1 for i, c in enumerate(self._components) if c.name == "etcd"), 0)
        self._components.insert(after_etcd, started)
        # The serving certificate exists only once the API server has written it.
        self._wait_for_file("kube-apiserver", self.credentials.ca_file)
        context = ssl.create_default_context(cafile=str(self.credentials.ca_file))
        self._wait_healthy(
            "kube-apiserver", self._ports.apiserver, "/readyz", context, token=self._token
        )

    def _write_kubeconfig(self) -> None:
        creds = self.credentials
        document = _kubeconfig(creds.server, creds.ca_file, creds.token)
        _write_private(creds.kubeconfig, yaml.safe_dump(document, sort_keys=False).encode())

    def _start_controller_manager(self) -> None:
        kubeconfig = str(self.credentials.kubeconfig)
        port = self._ports.controller_manager
        self._spawn(
            "kube-controller-manager",
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--controllers={self._controllers}",
            # Each controller as its own service account, as kubeadm runs it: the Job
            # controller's pods then come from system:serviceaccount:kube-system:job-controller,
            # which the webhook configuration's match condition lets skip the webhook.
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--service-account-private-key-file={self._workdir / 'service-account.key'}",
            f"--root-ca-file={self.credentials.ca_file}",
        )
        self._wait_healthy("kube-controller-manager", port, "/healthz", _unverified_tls())

    # ------------------------------------------------------------------ processes

    def _spawn(self, name: str, *args: str) -> None:
        log_path = self._workdir / "logs" / f"{name}.log"
        log_file = log_path.open("ab")
        try:
            process = subprocess.Popen(
                [str(self._binaries / name), *args],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self._workdir,
                # Its own process group, so stop() reaches anything it forks.
                start_new_session=True,
            )
        except BaseException:
            log_file.close()
            raise
        self._components.append(_Component(name, process, log_path, log_file))
        log.info("e2e.component.started", extra=fields(component=name, pid=process.pid))

    def _component(self, name: str) -> _Component:
        return next(c for c in self._components if c.name == name)

    def _check_alive(self, name: str) -> None:
        component = self._component(name)
        code = component.process.poll()
        if code is not None:
            raise ControlPlaneError(
                f"{name} exited with {code}; {component.log_path}:\n{_log_tail(component.log_path)}"
            )

    def _deadline_passed(self, started: float) -> bool:
        return self._clock.monotonic() - started > self._ready_timeout

    def _timed_out(self, name: str, what: str) -> ControlPlaneError:
        component = self._component(name)
        return ControlPlaneError(
            f"{name}: {what} after {self._ready_timeout:.0f} s; {component.log_path}:\n"
            f"{_log_tail(component.log_path)}"
        )

    def _wait_for_file(self, name: str, path: Path) -> None:
        started = self._clock.monotonic()
        while not path.exists():
            self._check_alive(name)
            if self._deadline_passed(started):
                raise self._timed_out(name, f"no {path}")
            time.sleep(_POLL_SECONDS)

    def _wait_healthy(
        self, name: str, port: int, path: str, context: ssl.SSLContext | None, token: str = ""
    ) -> None:
        started = self._clock.monotonic()
        while _get(port, path, context=context, token=token) != http.HTTPStatus.OK:
            self._check_alive(name)
            if self._deadline_passed(started):
                raise self._timed_out(name, f"{path} not OK")
            time.sleep(_POLL_SECONDS)
        log.info(
            "e2e.component.ready",
            extra=fields(component=name, seconds=round(self._clock.monotonic() - started, 1)),
        )

    def _terminate(self, component: _Component) -> None:
        process = component.process
        try:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=_STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                log.warning("e2e.component.kill", extra=fields(component=component.name))
            # Also when the leader is gone: something it forked may linger in the group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        finally:
            component.log_file.close()
        log.info("e2e.component.stopped", extra=fields(component=component.name))


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> None:
    """Bring a control plane up by hand and keep it until Ctrl-C or SIGTERM."""
    # A shell starts background jobs with SIGINT ignored, and SIGTERM would skip the
    # cleanup: both become KeyboardInterrupt so the `with` below always stops everything.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    binaries = find_binaries(progress=sys.stderr)
    with (
        tempfile.TemporaryDirectory(prefix="tessera-e2e-") as tmp,
        ControlPlane(binaries, Path(tmp)) as plane,
    ):
        plane.apply_crds(find_crds(progress=sys.stderr))
        print(f"export KUBECONFIG={plane.credentials.kubeconfig}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
