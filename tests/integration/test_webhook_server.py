"""The webhook as kube-apiserver meets it: HTTPS on a real socket, certificates from
``certs``, the captured Job review, reinvocation, bad input, readiness and metrics; and
``python -m webhook`` refusing to start on bad certificate files.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import logging
import re
import ssl
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from cluster import jsonio
from cluster.clock import ManualClock
from cluster.tls import CertReloader, client_context
from loadtest.pinned import free_port
from tests.certfiles import Material, make_material
from tests.processes import server_main, wait_ready
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
    def __init__(self, url: str, session: aiohttp.ClientSession, store: PolicyStore) -> None:
        self.url, self.session, self.store = url, session, store

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


async def start(material: Material, store: PolicyStore) -> tuple[web.AppRunner, str]:
    settings = WebhookSettings(managed_namespaces=frozenset({"team-nlp"}))
    app = create_app(settings, store=store, clock=ManualClock())
    runner = web.AppRunner(app)
    await runner.setup()
    reloader = CertReloader(material["webhook.crt"], material["webhook.key"])
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=reloader.context)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"https://localhost:{port}"


@pytest.fixture
async def server(material: Material) -> AsyncIterator[Server]:
    store = PolicyStore(ManualClock())
    store.load_file(str(POLICY))
    runner, url = await start(material, store)
    connector = aiohttp.TCPConnector(ssl=client_context(material["ca.crt"]))
    async with aiohttp.ClientSession(connector=connector) as session:
        yield Server(url, session, store)
    await runner.cleanup()


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
    runner, url = await start(material, store)
    connector = aiohttp.TCPConnector(ssl=client_context(material["ca.crt"]))
    async with aiohttp.ClientSession(connector=connector) as session:
        client = Server(url, session, store)
        assert (await client.get("/readyz"))[0] == 503
        status, answer = await client.post(jsonio.dumps(captured_job_review()))
        assert status == 503
        assert "policy" in answer["message"]
        store.load_file(str(POLICY))
        assert (await client.get("/readyz"))[0] == 200
        assert (await client.post(jsonio.dumps(captured_job_review())))[0] == 200
    await runner.cleanup()


async def test_metrics_count_reviews_by_decision(server: Server) -> None:
    await server.post(jsonio.dumps(captured_job_review()))
    await server.post(b"garbage")
    status, text = await server.get("/metrics")
    assert status == 200
    assert (
        'tessera_webhook_reviews_total{decision="mutated",kind="Job",queue="team-nlp-queue",'
        'reason="admitted"} 1.0' in text
    )
    assert 'decision="malformed"' in text
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
    _, text = await server.get("/metrics")
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


async def test_main_serves_the_policy_file_over_tls(material: Material) -> None:
    port = free_port()
    context: ssl.SSLContext = client_context(material["ca.crt"])
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
    ) as server:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            await wait_ready(session, f"https://localhost:{port}/readyz")
            webhook = Server(f"https://localhost:{port}", session, PolicyStore(ManualClock()))
            status, answer = await webhook.post(jsonio.dumps(captured_job_review()))
            assert status == 200
            assert answer["response"]["allowed"] is True
            _, metrics = await webhook.get("/metrics")
        # Kubernetes stops a pod with SIGTERM: a clean exit, not a traceback
        assert await server.stop() == 0
    # the collector's pauses are on the page, the full collection before serving first
    full = re.search(r'tessera_webhook_gc_pause_seconds_count{generation="2"} (\S+)', metrics)
    assert full is not None
    assert float(full.group(1)) >= 1
    logged = server.logged
    assert "serving" in logged
    assert "stopping" in logged
    assert "Traceback" not in logged
