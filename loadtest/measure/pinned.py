"""A server under benchmark as a child process pinned to one CPU, and what ``/proc`` says
of it.

Layer: I/O (starts and stops processes, reads ``/proc``, makes the
servers' certificates). Used by the benchmarks and the load test's local targets; must not
decide anything about what the server answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cluster.clock import Clock
from loadtest.ports import free_port

ROOT: Final = Path(__file__).resolve().parents[2]
PIN_AND_RUN: Final = (
    "import os, runpy, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); "
    "module = sys.argv[2]; sys.argv = [module, *sys.argv[3:]]; "
    "runpy.run_module(module, run_name='__main__', alter_sys=True)"
)
"""``python -m MODULE ARGS`` on one CPU, pinned before anything is imported (what
``taskset -c CPU`` does, without needing util-linux)."""
SERVER_NAME: Final = "localhost"
"""The name the client verifies (``python -m certs --dns localhost``), as a Service's DNS
name would be in a cluster; the socket goes to 127.0.0.1 only."""


class BenchError(Exception):
    """Something that stops the benchmark; the message says what to do."""


def proc_memory(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of a process, in bytes."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) * 1024
    return found


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Settled:
    """How long ``wait_settled`` waited, and the CPU the processes used in its last window
    (in cores: 0.05 is 5 % of one)."""

    waited_s: float
    cores: float
    settled: bool


def wait_settled(
    pids: Sequence[int],
    clock: Clock,
    sleep: Callable[[float], None],
    *,
    cpu_s: Callable[[int], float] = proc_cpu_s,
    window_s: float = 2.0,
    below_cores: float = 0.05,
    limit_s: float = 120.0,
) -> Settled:
    """Wait until ``pids`` together use less than ``below_cores`` over a ``window_s``
    window, for at most ``limit_s``.

    Why: a controller that has just started reconciles what it finds (Kueue, given 1,000
    LocalQueues, writes their status for tens of seconds), and a benchmark that starts
    meanwhile gives the CPU it takes on a shared core to neither server's account."""
    started = clock.monotonic()
    used = sum(cpu_s(pid) for pid in pids)
    while True:
        sleep(window_s)
        before, used = used, sum(cpu_s(pid) for pid in pids)
        cores = (used - before) / window_s
        waited = clock.monotonic() - started
        if cores < below_cores or waited >= limit_s:
            return Settled(waited, cores, cores < below_cores)


def _fixed_work(rounds: int) -> int:
    total = 0
    for i in range(rounds):
        total += i * i
    return total


def fixed_work_seconds(
    core: int, clock: Clock, *, size_s: float = 0.003, runs: int = 500
) -> list[float]:
    """How long one unchanging piece of CPU-bound Python takes, ``runs`` times over, on
    ``core`` (``size_s`` long when nothing interrupts it): whatever spread it
    shows is this machine's (other tenants, the hypervisor), never the code's: the floor
    under every latency percentile a benchmark here reports. The calling process goes
    back to the CPUs it had."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        rounds = 10_000
        while True:  # grow the work until it is long enough to time against size_s
            began = clock.monotonic()
            _fixed_work(rounds)
            took = clock.monotonic() - began
            if took >= size_s / 4:
                break
            rounds *= 4
        rounds = max(1, round(rounds * size_s / took))
        timings = []
        for _ in range(runs):
            began = clock.monotonic()
            _fixed_work(rounds)
            timings.append(clock.monotonic() - began)
    finally:
        os.sched_setaffinity(0, before)
    return timings


def set_priority(pid: int, nice: int) -> None:
    """Give a process (the leader of its own session) niceness ``nice``. Where the kernel
    groups processes by session ("autogroup") it shares the CPU between sessions before
    it looks at a process's niceness, so the session's group gets it too."""
    os.setpriority(os.PRIO_PROCESS, pid, nice)
    autogroup = Path(f"/proc/{pid}/autogroup")
    if autogroup.exists():
        autogroup.write_text(str(nice))


@dataclass(slots=True)
class Pinned:
    """``python -m module args`` on CPU ``core``, its output in ``log_path``."""

    name: str
    module: str
    args: list[str]
    core: int
    log_path: Path
    nice: int = 0
    port: int = field(default_factory=free_port)
    """Where it listens (the caller puts it into ``args``)."""
    process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.process.pid

    @property
    def command(self) -> str:
        return f"python -m {self.module} " + " ".join(self.args)

    def start(self, stack: ExitStack) -> None:
        """Start it; ``stack`` stops it (and closes its log) when it unwinds."""
        log = stack.enter_context(self.log_path.open("wb"))
        self.process = subprocess.Popen(  # noqa: S603 - our interpreter, our arguments
            [sys.executable, "-c", PIN_AND_RUN, str(self.core), self.module, *self.args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a scheduler autogroup of its own, see set_priority
        )
        stack.callback(self.stop)
        if self.nice:
            set_priority(self.process.pid, self.nice)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def rss_mib(self) -> float:
        return proc_memory(self.pid).get("VmRSS", 0) / (1024 * 1024)


def make_certs(folder: Path) -> None:
    """Fresh certificates for the servers under test (``python -m certs``), naming
    ``SERVER_NAME`` and 127.0.0.1, in ``folder``."""
    done = subprocess.run(  # noqa: S603 - our interpreter, our arguments
        [
            sys.executable,
            "-m",
            "certs",
            "--out",
            str(folder),
            "--dns",
            SERVER_NAME,
            "--ip",
            "127.0.0.1",
        ],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"python -m certs failed: {done.stderr.decode(errors='replace')}")


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, for a report's header."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown"
