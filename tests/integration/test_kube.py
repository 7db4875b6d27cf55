"""The Kubernetes API client and its three ways to configure, over real sockets and TLS.

A fake kube-apiserver with a throwaway CA stands in for the cluster; kubeconfig files and
service-account directories are written by the tests, the way a user or the kubelet would.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from cluster.clock import ManualClock
from cluster.kube import (
    METADATA_LIST_ACCEPT,
    METADATA_WATCH_ACCEPT,
    ApiError,
    ConfigError,
    KubeClient,
    KubeConfig,
    TransportError,
    WatchEvent,
)
from tests.fakeapi import FakeApiServer, TlsFiles, make_tls

TOKEN = "s3cret-token"
NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"


def pod(name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "x"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec},
    }


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def api(tls: TlsFiles) -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token=TOKEN, ssl_context=tls.server_context()) as server:
        yield server


@pytest.fixture
async def client(api: FakeApiServer, tls: TlsFiles) -> AsyncIterator[KubeClient]:
    config = KubeConfig.explicit(api.url, token=TOKEN, ca_file=tls.ca_cert)
    async with KubeClient(config) as kube:
        yield kube


# ---------------------------------------------------------------- explicit configuration


@pytest.mark.parametrize(
    ("kwargs", "complaint"),
    [
        ({"server": "ftp://example"}, r"http\(s\) URL"),
        ({"server": "not a url"}, r"http\(s\) URL"),
        ({"server": "https://k8s", "cert_file": Path("c.crt")}, "both cert_file and key_file"),
        ({"server": "https://k8s", "token": "t", "token_file": Path("t")}, "not both"),
    ],
)
def test_explicit_config_rejects_what_cannot_work(kwargs: dict[str, Any], complaint: str) -> None:
    rest = {key: value for key, value in kwargs.items() if key != "server"}
    with pytest.raises(ConfigError, match=complaint):
        KubeConfig.explicit(kwargs["server"], **rest)


def test_the_token_never_shows_in_the_config_repr() -> None:
    config = KubeConfig.explicit("https://k8s:6443/", token=TOKEN)
    assert TOKEN not in repr(config)
    assert config.server == "https://k8s:6443"


# ---------------------------------------------------------------- requests


async def test_get_sends_the_bearer_token_over_verified_tls(
    api: FakeApiServer, client: KubeClient
) -> None:
    api.put(PODS, pod("a"))
    got = await client.get_json("/api/v1/namespaces/default/pods/a")
    assert got["metadata"]["name"] == "a"
    assert api.requests[-1].headers["Authorization"] == f"Bearer {TOKEN}"


async def test_a_cookie_the_server_sets_is_never_sent_back(tls: TlsFiles) -> None:
    """As client-go: no cookie jar, so what a proxy in front of kube-apiserver sets is
    not replayed on the requests after it (nor filtered for each of them)."""

    async def set_cookie(_request: web.Request, response: web.StreamResponse) -> None:
        response.headers.add("Set-Cookie", "session=from-a-proxy; Path=/")

    server = FakeApiServer(token=TOKEN, ssl_context=tls.server_context())
    server.app.on_response_prepare.append(set_cookie)
    async with server as api:
        api.put(PODS, pod("a"))
        # by name: a cookie jar keeps nothing an IP address sets
        by_name = api.url.replace("127.0.0.1", "localhost")
        config = KubeConfig.explicit(by_name, token=TOKEN, ca_file=tls.ca_cert)
        async with KubeClient(config) as kube:
            for _ in range(2):
                await kube.get_json("/api/v1/namespaces/default/pods/a")
    assert len(api.requests) == 2
    assert all("Cookie" not in r.headers for r in api.requests)


async def test_list_follows_continue_tokens_and_returns_the_list_version(
    api: FakeApiServer, client: KubeClient
) -> None:
    for i in range(7):
        api.put(PODS, pod(f"p{i}"))
    items, resource_version = await client.list(
        "/api/v1/namespaces/default/pods", {"labelSelector": "app=x"}, page_size=3
    )
    assert [item["metadata"]["name"] for item in items] == [f"p{i}" for i in range(7)]
    assert resource_version == api.resource_version
    pages = api.requests_of("list")
    assert len(pages) == 3
    assert all(p.query["labelSelector"] == "app=x" and p.query["limit"] == "3" for p in pages)


async def test_a_list_and_a_watch_of_metadata_only_ask_for_it_and_others_do_not(
    api: FakeApiServer, client: KubeClient
) -> None:
    await client.list(PODS, metadata_only=True)
    await client.list(PODS)
    since = api.resource_version
    for metadata_only in (True, False):
        events = client.watch(PODS, since, timeout_s=1, metadata_only=metadata_only)
        async with contextlib.aclosing(events):
            watching = asyncio.create_task(anext(events, None))
            async with asyncio.timeout(5):
                while api.watchers == 0:  # noqa: ASYNC110 (the server is on this loop)
                    await asyncio.sleep(0.002)
            api.end_watches()
            await watching
    accepts = [r.headers["Accept"] for r in api.requests if r.kind in ("list", "watch")]
    assert accepts == [
        METADATA_LIST_ACCEPT,
        "application/json",
        METADATA_WATCH_ACCEPT,
        "application/json",
    ]


async def test_post_creates_and_a_second_binding_is_a_conflict(
    api: FakeApiServer, client: KubeClient
) -> None:
    created = await client.post_json("/api/v1/namespaces/team/pods", pod("w", namespace="team"))
    assert created["metadata"]["resourceVersion"]
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "w", "namespace": "team"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"},
    }
    await client.post_json("/api/v1/namespaces/team/pods/w/binding", binding)
    assert api.objects(PODS)["team/w"]["spec"]["nodeName"] == "gpu-1"

    with pytest.raises(ApiError) as caught:
        await client.post_json("/api/v1/namespaces/team/pods/w/binding", binding)
    assert caught.value.status == 409
    assert caught.value.reason == "Conflict"
    assert "already assigned" in caught.value.message


async def test_delete_removes_the_object_and_a_second_delete_is_not_found(
    api: FakeApiServer, client: KubeClient
) -> None:
    api.put(PODS, pod("gone", namespace="team"))
    deleted = await client.delete_json("/api/v1/namespaces/team/pods/gone")
    assert deleted["metadata"]["name"] == "gone"
    assert "team/gone" not in api.objects(PODS)

    with pytest.raises(ApiError) as caught:
        await client.delete_json("/api/v1/namespaces/team/pods/gone")
    assert caught.value.status == 404
    assert caught.value.reason == "NotFound"


@pytest.mark.parametrize(
    ("patch_type", "body", "content_type"),
    [
        ("merge", {"metadata": {"annotations": {"a": "1"}}}, "application/merge-patch+json"),
        (
            "strategic",
            {"metadata": {"annotations": {"a": "1"}}},
            "application/strategic-merge-patch+json",
        ),
        (
            "json",
            [{"op": "add", "path": "/metadata/annotations", "value": {"a": "1"}}],
            "application/json-patch+json",
        ),
    ],
)
async def test_patch_sends_the_content_type_of_its_patch_type(
    api: FakeApiServer, client: KubeClient, patch_type: Any, body: Any, content_type: str
) -> None:
    api.put(PODS, pod("a"))
    patched = await client.patch_json("/api/v1/namespaces/default/pods/a", body, patch_type)
    assert patched["metadata"]["annotations"] == {"a": "1"}
    assert api.requests[-1].headers["Content-Type"] == content_type
    assert api.requests[-1].json() == body


@pytest.mark.parametrize(
    ("path", "status", "reason"),
    [
        ("/api/v1/namespaces/default/pods/missing", 404, "NotFound"),
        # Not a Kubernetes route: the body is not a Status, the HTTP line still tells.
        ("/not/an/api", 404, "Not Found"),
    ],
)
async def test_failures_raise_api_error_from_the_status(
    client: KubeClient, path: str, status: int, reason: str
) -> None:
    with pytest.raises(ApiError) as caught:
        await client.get_json(path)
    assert (caught.value.status, caught.value.reason) == (status, reason)


async def test_a_wrong_token_is_a_401(api: FakeApiServer, tls: TlsFiles) -> None:
    config = KubeConfig.explicit(api.url, token="wrong", ca_file=tls.ca_cert)
    async with KubeClient(config) as kube:
        with pytest.raises(ApiError) as caught:
            await kube.get_json(NODES)
    assert caught.value.status == 401


async def test_a_server_signed_by_another_ca_is_refused_unless_insecure(
    api: FakeApiServer, tmp_path: Path
) -> None:
    other = make_tls(tmp_path / "other")
    refused = KubeConfig.explicit(api.url, token=TOKEN, ca_file=other.ca_cert)
    async with KubeClient(refused) as kube:
        with pytest.raises(TransportError, match="certificate verify failed"):
            await kube.get_json(NODES)
    insecure = KubeConfig.explicit(api.url, token=TOKEN, insecure=True)
    async with KubeClient(insecure) as kube:
        assert (await kube.get_json(NODES))["items"] == []


async def test_missing_tls_files_are_a_config_error(tmp_path: Path) -> None:
    config = KubeConfig.explicit("https://127.0.0.1:1", ca_file=tmp_path / "absent.crt")
    with pytest.raises(ConfigError, match=r"absent\.crt"):
        async with KubeClient(config):
            pass


async def test_a_closed_port_is_a_transport_error(tls: TlsFiles) -> None:
    async with FakeApiServer() as server:
        url = server.url
    async with KubeClient(KubeConfig.explicit(url)) as kube:
        with pytest.raises(TransportError):
            await kube.get_json(NODES)


async def test_the_token_is_never_logged(
    api: FakeApiServer, client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with KubeClient(client.config) as kube:
        await kube.get_json(NODES)
        with pytest.raises(ApiError):
            await kube.get_json("/api/v1/namespaces/default/pods/missing")
    assert caplog.records
    for record in caplog.records:
        assert TOKEN not in record.getMessage()
        assert TOKEN not in repr(record.__dict__)


# ---------------------------------------------------------------- watch


async def _collect(kube: KubeClient, resource_version: str) -> list[WatchEvent]:
    return [event async for event in kube.watch(NODES, resource_version, timeout_s=5)]


async def test_watch_reads_events_larger_than_a_stream_buffer(
    api: FakeApiServer, client: KubeClient
) -> None:
    since = api.resource_version
    big = "x" * 400_000  # an object near the API's size limit, far above 128 KiB lines
    api.put(NODES, {"metadata": {"name": "big", "annotations": {"blob": big}}})
    api.put(NODES, {"metadata": {"name": "small"}})
    watch = asyncio.create_task(_collect(client, since))
    async with asyncio.timeout(5):
        while api.watchers == 0:  # noqa: ASYNC110 (the server is on this loop)
            await asyncio.sleep(0.002)
    api.put("/api/v1/configmaps", {"metadata": {"name": "elsewhere", "namespace": "x"}})
    bookmark = api.send_bookmark()
    api.end_watches()
    events = await watch
    assert [e.type for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    assert events[0].object["metadata"]["annotations"]["blob"] == big
    assert events[2].resource_version == bookmark == api.resource_version
    query = api.requests_of("watch")[0].query
    assert query["allowWatchBookmarks"] == "true"
    assert query["resourceVersion"] == since
    assert query["timeoutSeconds"] == "5"


async def test_watch_raises_an_error_event_as_api_error_410(
    api: FakeApiServer, client: KubeClient
) -> None:
    since = api.resource_version
    api.put(NODES, {"metadata": {"name": "n"}})
    api.compact()
    with pytest.raises(ApiError) as caught:
        await _collect(client, since)
    assert caught.value.gone
    assert caught.value.reason == "Expired"


async def test_watch_raises_a_truncated_stream_as_transport_error(
    api: FakeApiServer, client: KubeClient
) -> None:
    since = api.resource_version
    api.put(NODES, {"metadata": {"name": "n1"}})
    api.put(NODES, {"metadata": {"name": "n2"}})
    seen: list[str] = []

    async def read_then_cut() -> None:
        async for event in client.watch(NODES, since, timeout_s=5):
            seen.append(event.object["metadata"]["name"])
            api.drop_watches(after_events=0)

    with pytest.raises(TransportError):
        await read_then_cut()
    assert seen[0] == "n1"


# ---------------------------------------------------------------- in-cluster


def _service_account(directory: Path, token: str, ca: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes(ca.read_bytes())
    (directory / "namespace").write_text("tessera-system")
    return directory


@pytest.mark.parametrize(
    ("host", "server"),
    [("10.96.0.1", "https://10.96.0.1:443"), ("fd00::1", "https://[fd00::1]:443")],
)
def test_in_cluster_config_reads_the_service_environment_and_account(
    tmp_path: Path, tls: TlsFiles, host: str, server: str
) -> None:
    account = _service_account(tmp_path / "sa", "tok", tls.ca_cert)
    environ = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": "443"}
    config = KubeConfig.in_cluster(environ, account_dir=account)
    assert config.server == server
    assert config.token_file == account / "token"
    assert config.ca_file == account / "ca.crt"
    assert config.token is None


@pytest.mark.parametrize(
    ("environ", "token", "complaint"),
    [
        ({}, "tok", "not running in a cluster"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "tok", "not running in a cluster"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, "", "token"),
    ],
)
def test_in_cluster_config_says_what_is_missing(
    tmp_path: Path, tls: TlsFiles, environ: dict[str, str], token: str, complaint: str
) -> None:
    account = _service_account(tmp_path / "sa", token, tls.ca_cert)
    with pytest.raises(ConfigError, match=complaint):
        KubeConfig.in_cluster(environ, account_dir=account)


async def test_in_cluster_client_follows_a_rotated_token(
    api: FakeApiServer, tls: TlsFiles, tmp_path: Path
) -> None:
    account = _service_account(tmp_path / "sa", TOKEN, tls.ca_cert)
    port = api.url.rsplit(":", 1)[1]
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    clock = ManualClock()
    async with KubeClient(
        KubeConfig.in_cluster(environ, account_dir=account), clock=clock, token_reload_s=60
    ) as kube:
        await kube.get_json(NODES)
        # The kubelet rotates the token; the server stops accepting the old one.
        (account / "token").write_text("rotated-token\n")
        api.token = "rotated-token"
        clock.advance(30)
        with pytest.raises(ApiError):
            await kube.get_json(NODES)
        clock.advance(30)
        await kube.get_json(NODES)
    assert api.requests[-1].headers["Authorization"] == "Bearer rotated-token"


# ---------------------------------------------------------------- kubeconfig


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _kubeconfig(path: Path, server: str, users: dict[str, dict[str, Any]], current: str) -> Path:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": name, "user": user} for name, user in users.items()],
        "contexts": [
            {"name": name, "context": {"cluster": "fake", "user": name}} for name in users
        ],
        "current-context": current,
    }
    path.write_text(yaml.safe_dump(document))
    return path


async def test_kubeconfig_token_user_with_a_ca_file_and_a_chosen_context(
    api: FakeApiServer, tls: TlsFiles, tmp_path: Path
) -> None:
    kubeconfig = _kubeconfig(
        tmp_path / "config",
        api.url,
        {"admin": {"token": TOKEN}, "nobody": {"token": "wrong"}},
        current="nobody",
    )
    document = yaml.safe_load(kubeconfig.read_text())
    document["clusters"][0]["cluster"]["certificate-authority"] = str(tls.ca_cert)
    kubeconfig.write_text(yaml.safe_dump(document))

    config = await KubeConfig.from_kubeconfig(kubeconfig, context="admin")
    assert (config.server, config.token, config.ca_file) == (api.url, TOKEN, tls.ca_cert)
    async with KubeClient(config) as kube:
        await kube.get_json(NODES)
    assert kubeconfig.read_text() == yaml.safe_dump(document), "the file is left as it was"


async def test_kubeconfig_client_certificate_user_with_embedded_data(
    tls: TlsFiles, tmp_path: Path
) -> None:
    server_context = tls.server_context(require_client_cert=True)
    async with FakeApiServer(ssl_context=server_context) as api:
        kubeconfig = _kubeconfig(
            tmp_path / "config",
            api.url,
            {
                "cert-user": {
                    "client-certificate-data": _b64(tls.client_cert),
                    "client-key-data": _b64(tls.client_key),
                }
            },
            current="cert-user",
        )
        document = yaml.safe_load(kubeconfig.read_text())
        document["clusters"][0]["cluster"]["certificate-authority-data"] = _b64(tls.ca_cert)
        kubeconfig.write_text(yaml.safe_dump(document))

        config = await KubeConfig.from_kubeconfig(kubeconfig, temp_dir=tmp_path / "kube")
        assert config.token is None
        assert config.cert_file is not None
        assert config.key_file is not None
        assert config.cert_file.read_bytes() == tls.client_cert.read_bytes()
        async with KubeClient(config) as kube:
            await kube.get_json(NODES)
        # Without the client certificate the TLS handshake itself is refused.
        no_cert = KubeConfig.explicit(api.url, ca_file=config.ca_file)
        async with KubeClient(no_cert) as kube:
            with pytest.raises(TransportError):
                await kube.get_json(NODES)


async def test_kubeconfig_exec_plugin_token(
    api: FakeApiServer, tls: TlsFiles, tmp_path: Path
) -> None:
    plugin = tmp_path / "plugin.py"
    credential = (
        '{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", '
        f'"status": {{"token": "{TOKEN}"}}}}'
    )
    plugin.write_text(f"print({credential!r})\n")
    exec_user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [os.fspath(plugin)],
            "interactiveMode": "Never",
        }
    }
    kubeconfig = _kubeconfig(tmp_path / "config", api.url, {"exec": exec_user}, "exec")
    document = yaml.safe_load(kubeconfig.read_text())
    document["clusters"][0]["cluster"]["certificate-authority"] = str(tls.ca_cert)
    kubeconfig.write_text(yaml.safe_dump(document))

    config = await KubeConfig.from_kubeconfig(kubeconfig)
    assert config.token == TOKEN
    async with KubeClient(config) as kube:
        await kube.get_json(NODES)


@pytest.mark.parametrize(
    ("user", "context", "complaint"),
    [
        ({"token": "t"}, "missing-context", "missing-context"),
        ({"username": "u", "password": "p"}, None, "Basic auth"),
    ],
)
async def test_kubeconfig_problems_are_config_errors(
    tmp_path: Path, user: dict[str, Any], context: str | None, complaint: str
) -> None:
    kubeconfig = _kubeconfig(tmp_path / "config", "https://k8s:6443", {"u": user}, "u")
    with pytest.raises(ConfigError, match=complaint):
        await KubeConfig.from_kubeconfig(kubeconfig, context=context)


async def test_a_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot load kubeconfig"):
        await KubeConfig.from_kubeconfig(tmp_path / "nope")


async def test_a_server_uses_its_kubeconfig_when_given_else_its_service_account(
    tmp_path: Path,
) -> None:
    kubeconfig = _kubeconfig(tmp_path / "config", "https://k8s:6443", {"u": {"token": "t"}}, "u")
    given = await KubeConfig.of(kubeconfig, {})
    assert (given.server, given.token) == ("https://k8s:6443", "t")
    # no kubeconfig and no KUBERNETES_SERVICE_HOST: the in-cluster error, naming what lacks
    with pytest.raises(ConfigError, match="not running in a cluster"):
        await KubeConfig.of(None, {})
