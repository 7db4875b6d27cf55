"""The webhook as kube-apiserver meets it: HTTPS on a real socket, certificates from
``certs``, the captured Job review, reinvocation, bad input, readiness, metrics on their
own port and never on the serving one; ``python -m webhook`` refusing to start on bad
certificate files, and draining what is under way when it gets SIGTERM.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import io
import logging
import re
import signal
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cluster import jsonio, labels
from cluster.clock import ManualClock
from loadtest.ports import free_port
from server import serving
from server.tls import CertReloader, client_context
from tests.certfiles import Material, make_material
from tests.processes import ServerProcess, server_main, wait_ready
from webhook.app import create_app
from webhook.patch import apply_patch
from webhook.settings import WebhookSettings
from webhook.source import PolicyStore

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "tests" / "golden" / "webhook" / "policy.yaml"
CAPTURES = ROOT.parent / "shared" / "captures"
CAPTURED_JOB = CAPTURES / "000-webhook-mutate-request.json"


def captured_job_review() -> dict[str, Any]:
    if not CAPTURED_JOB.is_file():
        pytest.skip(f"captures not found at {CAPTURES} (the shared folder beside the repo)")
    body: dict[str, Any] = jsonio.loads(CAPTURED_JOB.read_bytes())["body"]
    return body


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Material:
    return make_material(tmp_path_factory.mktemp("certs"))


class Server:
    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession,
        store: PolicyStore,
        metrics_url: str = "",
    ) -> None:
        self.url, self.session, self.store = url, session, store
        self.metrics_url = metrics_url

    async def post(self, body: bytes | io.BytesIO) -> tuple[int, Any]:
        async with self.session.post(
            self.url + "/mutate?timeout=5s",
            data=body,
            headers={"Content-Type": "application/json"},
        ) as response:
            return response.status, jsonio.loads(await response.read())

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.url + path) as response:
            return response.status, await response.text()

    async def metrics(self) -> str:
        async with self.session.get(self.metrics_url + "/metrics") as response:
            assert response.status == 200
            return await response.text()


@contextlib.asynccontextmanager
async def started(material: Material, store: PolicyStore) -> AsyncIterator[Server]:
    """The webhook as ``python -m webhook`` serves it: guarded, over TLS, its metrics on
    a plain-HTTP listener of their own; and a client trusting its CA, for the block.
    All are closed however the block ends: a test that skips (no captures) or fails
    half-way must not leave a listening socket for the collector to find in some later
    test, where ``filterwarnings = error`` makes its ResourceWarning that test's error."""
    settings = WebhookSettings(managed_namespaces=frozenset({"team-nlp"}))
    clock = ManualClock()
    app = create_app(settings, store=store, clock=clock)
    reloader = CertReloader(material["webhook.crt"], material["webhook.key"])
    metrics = serving.metrics_app(app[serving.EXPOSITION], clock)
    connector = aiohttp.TCPConnector(ssl=client_context(material["ca.crt"]))
    async with (
        serving.running(app, "127.0.0.1", 0, reloader.context, shutdown_grace_s=1) as port,
        serving.running(metrics, "127.0.0.1", 0) as metrics_port,
        aiohttp.ClientSession(connector=connector) as session,
    ):
        yield Server(
            f"https://localhost:{port}", session, store, f"http://127.0.0.1:{metrics_port}"
        )


@pytest.fixture
async def server(material: Material) -> AsyncIterator[Server]:
    store = PolicyStore(ManualClock())
    store.load_file(str(POLICY))
    async with started(material, store) as running:
        yield running


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    patch: list[dict[str, Any]] = jsonio.loads(base64.b64decode(response["patch"]))
    return patch


async def test_captured_job_is_suspended_and_labelled_over_tls(server: Server) -> None:
    review = captured_job_review()
    status, answer = await server.post(jsonio.dumps(review))
    assert status == 200
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == review["request"]["uid"]
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    job = apply_patch(review["request"]["object"], decoded_patch(response))
    assert job["spec"]["suspend"] is True
    template = job["spec"]["template"]
    assert template["metadata"]["labels"]["tessera.dev/gang"].startswith("team-nlp.finetune-")
    assert template["metadata"]["annotations"]["tessera.dev/gang-size"] == "2"
    assert template["spec"]["schedulerName"] == "tessera-gpu"
    assert template["spec"]["affinity"]["nodeAffinity"]

    # kube-apiserver reinvokes with the patched object: nothing more to change.
    review["request"]["object"] = job
    status, again = await server.post(jsonio.dumps(review))
    assert status == 200
    assert again["response"]["allowed"] is True
    assert "patch" not in again["response"]


async def test_a_denial_says_what_to_change(server: Server) -> None:
    review = captured_job_review()
    review["request"]["object"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "nope"
    status, answer = await server.post(jsonio.dumps(review))
    assert status == 200
    response = answer["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "nope" in response["status"]["message"]
    assert "team-nlp-queue" in response["status"]["message"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(b"{not json", "not valid JSON", id="not-json"),
        pytest.param(b'{"kind":"AdmissionReview","apiVersion":"v1"}', "apiVersion", id="version"),
        pytest.param(
            b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{}}',
            "uid",
            id="no-uid",
        ),
        pytest.param(b"", "", id="empty"),
    ],
)
async def test_malformed_reviews_get_400_with_a_reason(
    server: Server, body: bytes, reason: str
) -> None:
    status, answer = await server.post(body)
    assert status == 400
    assert answer["code"] == 400
    assert reason in answer["message"]


async def test_a_10_mb_body_is_refused_quickly_and_the_server_lives_on(server: Server) -> None:
    async with asyncio.timeout(5):
        status, answer = await server.post(io.BytesIO(b"[" + b"0," * (5 * 1024 * 1024) + b"0]"))
    assert status == 400
    assert "exceeds" in answer["message"]
    status, _ = await server.get("/healthz")
    assert status == 200


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        pytest.param("gzip", zlib.compress(b"{}"), id="deflate-sent-as-gzip"),
        pytest.param("gzip", gzip.compress(b"{}")[:10] + b"\xff" * 8, id="gzip-spoiled"),
        pytest.param("deflate", b"not deflate", id="not-deflate"),
    ],
)
async def test_a_body_that_does_not_inflate_gets_400_not_500(
    server: Server, encoding: str, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by tests/fuzz: aiohttp inflates the body as the handler reads it, and
    raised out of the handler when it could not."""
    async with server.session.post(
        server.url + "/mutate",
        data=body,
        headers={"Content-Type": "application/json", "Content-Encoding": encoding},
        compress=False,
    ) as response:
        status, answer = response.status, jsonio.loads(await response.read())
        # what is left of the stream cannot be read: the client must not send more on it
        assert response.headers["Connection"] == "close"
    assert status == 400
    assert answer["kind"] == "Status"
    assert f"cannot be read as {encoding}" in answer["message"]
    assert (await server.get("/healthz"))[0] == 200
    assert [r.message for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_not_ready_until_the_policy_is_synced(material: Material) -> None:
    store = PolicyStore(ManualClock())
    async with started(material, store) as client:
        assert (await client.get("/readyz"))[0] == 503
        status, answer = await client.post(jsonio.dumps(captured_job_review()))
        assert status == 503
        assert "policy" in answer["message"]
        store.load_file(str(POLICY))
        assert (await client.get("/readyz"))[0] == 200
        assert (await client.post(jsonio.dumps(captured_job_review())))[0] == 200


async def test_metrics_count_reviews_by_decision_on_their_own_port_only(server: Server) -> None:
    await server.post(jsonio.dumps(captured_job_review()))
    await server.post(b"garbage")
    made_up = captured_job_review()
    made_up["request"]["object"]["metadata"]["labels"][labels.QUEUE_NAME] = "q" * 300
    await server.post(jsonio.dumps(made_up))
    # whoever reaches the Service must not read the queues and namespaces they count
    assert (await server.get("/metrics"))[0] == 404
    text = await server.metrics()
    assert (
        'tessera_webhook_reviews_total{decision="mutated",kind="Job",queue="team-nlp-queue",'
        'reason="admitted"} 1.0' in text
    )
    assert 'decision="malformed"' in text
    # what a user writes is never a label: a queue that does not exist is "unknown"
    assert 'queue="unknown"' in text
    assert "qqq" not in text
    assert "tessera_webhook_review_seconds_bucket" in text
    assert "tessera_webhook_policy_age_seconds" in text


async def test_a_renamed_job_is_answered_from_what_was_kept_and_metrics_say_so(
    server: Server,
) -> None:
    first = captured_job_review()
    again = captured_job_review()
    again["request"]["uid"] = "another-request"
    again["request"]["object"]["metadata"]["generateName"] = "sweep-"
    answers = [(await server.post(jsonio.dumps(review)))[1] for review in (first, again)]
    assert [a["response"]["allowed"] for a in answers] == [True, True]
    assert answers[1]["response"]["uid"] == "another-request"
    patches = [jsonio.loads(base64.b64decode(a["response"]["patch"])) for a in answers]
    gangs = [
        next(op["value"] for op in patch if op["path"] == "/spec/template/metadata/labels")
        for patch in patches
    ]
    assert gangs[0]["tessera.dev/gang"].startswith("team-nlp.finetune-")
    assert gangs[1]["tessera.dev/gang"].startswith("team-nlp.sweep-")
    text = await server.metrics()
    assert 'tessera_webhook_answers_total{source="computed"} 1.0' in text
    assert 'tessera_webhook_answers_total{source="kept"} 1.0' in text


async def test_plain_http_gets_no_answer(server: Server) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    async with aiohttp.ClientSession() as plain:
        with pytest.raises(aiohttp.ClientError):
            async with plain.get(f"http://127.0.0.1:{port}/healthz") as response:
                await response.read()


def run_main(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def test_main_refuses_a_mismatched_key_naming_the_file(material: Material) -> None:
    result = run_main(
        "--tls-cert",
        str(material["webhook.crt"]),
        "--tls-key",
        str(material["extender.key"]),
        "--policy-file",
        str(POLICY),
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "extender.key" in result.stderr or "webhook.crt" in result.stderr


def test_main_refuses_a_missing_certificate(tmp_path: Path) -> None:
    missing = tmp_path / "nope.crt"
    result = run_main("--tls-cert", str(missing), "--tls-key", str(missing))
    assert result.returncode == 1
    assert str(missing) in result.stderr
    assert "Traceback" not in result.stderr


@dataclass
class Main:
    port: int
    metrics_url: str
    process: ServerProcess


@contextlib.asynccontextmanager
async def webhook_main(material: Material, *args: str) -> AsyncIterator[Main]:
    port, metrics_port = free_port(), free_port()
    async with server_main(
        "webhook",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tls-cert",
        str(material["webhook.crt"]),
        "--tls-key",
        str(material["webhook.key"]),
        "--policy-file",
        str(POLICY),
        "--metrics-port",
        str(metrics_port),
        *args,
    ) as server:
        context = client_context(material["ca.crt"])
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            await wait_ready(session, f"https://localhost:{port}/readyz")
        yield Main(port, f"http://127.0.0.1:{metrics_port}", server)


async def test_main_serves_the_policy_file_over_tls(material: Material) -> None:
    async with webhook_main(material) as main:
        server = main.process
        context = client_context(material["ca.crt"])
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            webhook = Server(
                f"https://localhost:{main.port}",
                session,
                PolicyStore(ManualClock()),
                main.metrics_url,
            )
            status, answer = await webhook.post(jsonio.dumps(captured_job_review()))
            assert status == 200
            assert answer["response"]["allowed"] is True
            assert (await webhook.get("/metrics"))[0] == 404
            metrics = await webhook.metrics()
        # Kubernetes stops a pod with SIGTERM: a clean exit, not a traceback
        assert await server.stop() == 0
    # the collector's pauses are on the page, the full collection before serving first
    full = re.search(r'tessera_webhook_gc_pause_seconds_count{generation="2"} (\S+)', metrics)
    assert full is not None
    assert float(full.group(1)) >= 1
    logged = server.logged
    assert "serving" in logged
    assert f"metrics={main.metrics_url.removeprefix('http://')}" in logged
    assert "stopping" in logged
    assert "Traceback" not in logged


# ---------------------------------------------------------------- SIGTERM


def raw_review(body: bytes) -> tuple[bytes, bytes]:
    """A review's head with the first 100 bytes of its body, and the rest of the body."""
    head = (
        f"POST /mutate?timeout=30s HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body[:100], body[100:]


async def refused(port: int) -> None:
    """Until a new connection to ``port`` is refused (bounded)."""
    async with asyncio.timeout(10):
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except ConnectionRefusedError:
                return
            writer.close()
            await asyncio.sleep(0.05)


async def under_way(metrics_url: str, requests: int) -> None:
    """Until the server's metrics show ``requests`` under way (bounded)."""
    wanted = f"tessera_webhook_requests_in_flight {float(requests)}"
    async with aiohttp.ClientSession() as session, asyncio.timeout(30):
        while True:
            async with session.get(metrics_url + "/metrics") as response:
                if wanted in (await response.text()).splitlines():
                    return
            await asyncio.sleep(0.05)


async def test_sigterm_stops_accepting_and_lets_the_review_under_way_finish(
    material: Material,
) -> None:
    body = jsonio.dumps(captured_job_review())
    start, rest = raw_review(body)
    context = client_context(material["ca.crt"])
    async with webhook_main(material, "--shutdown-grace", "20") as main:
        server = main.process
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", main.port, ssl=context, server_hostname="localhost"
        )
        idle = await asyncio.open_connection(
            "127.0.0.1", main.port, ssl=context, server_hostname="localhost"
        )
        writer.write(start)
        await under_way(main.metrics_url, 1)
        server.process.send_signal(signal.SIGTERM)
        await refused(main.port)
        async with asyncio.timeout(10):
            assert await idle[0].read() == b""  # an idle keep-alive connection is closed
        writer.write(rest)
        async with asyncio.timeout(10):
            status_line = await reader.readline()
        assert status_line.startswith(b"HTTP/1.1 200")
        writer.close()
        idle[1].close()
        async with asyncio.timeout(10):
            assert await server.process.wait() == 0
    assert "stopping" in server.logged
    assert "stopped" in server.logged
    assert "Traceback" not in server.logged


async def test_sigterm_gives_up_on_a_stalled_review_after_the_grace(material: Material) -> None:
    body = jsonio.dumps(captured_job_review())
    start, _ = raw_review(body)
    context = client_context(material["ca.crt"])
    async with webhook_main(material, "--shutdown-grace", "1", "--body-timeout", "60") as main:
        server = main.process
        _, writer = await asyncio.open_connection(
            "127.0.0.1", main.port, ssl=context, server_hostname="localhost"
        )
        writer.write(start)
        await under_way(main.metrics_url, 1)
        loop = asyncio.get_running_loop()
        signalled = loop.time()
        server.process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await server.process.wait() == 0
        took = loop.time() - signalled
        writer.close()
    assert 0.9 <= took <= 1 + 10, took
    assert "Traceback" not in server.logged
