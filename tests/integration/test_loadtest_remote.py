"""Remote mode against a stand-in deployment: a ``MiniApiServer`` plays the deployment's
kube-apiserver, both servers run as child processes (the extender watching and binding
through that API server), and the load test reaches them only by URL and kubeconfig.
Real sockets throughout. What must hold: every pod the run schedules exists in the
cluster while it runs, pods that end are deleted there so the extender frees and reuses
their GPUs, and nothing of the run is left behind."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cluster.clock import SystemClock
from cluster.kube import KubeConfig
from loadtest.__main__ import main
from loadtest.demo import modes as demo
from loadtest.inputs import fleet
from loadtest.sim import objects, remote_pods, scenario
from loadtest.sim.apiserver import NAMESPACES, NODES, PODS, MiniApiServer
from loadtest.sim.targets import local_servers

NAMESPACE = "lt-remote"


def small_run(tmp_path: Path, cluster: MiniApiServer) -> scenario.RunSpec:
    base = demo.demo_spec(short=True)
    return replace(
        base,
        fleet=fleet.FleetSpec(nodes=4),
        stream=replace(base.stream, rate=12.0, duration_s=3.0, median_run_s=0.5),
        drain_s=8.0,
        remote=scenario.Remote(
            "https://placeholder",
            "http://placeholder",
            kubeconfig=cluster.kubeconfig(tmp_path),
            namespace=NAMESPACE,
        ),
    )


async def test_remote_pods_are_created_deleted_and_cleaned_up(tmp_path: Path) -> None:
    clock = SystemClock()
    async with MiniApiServer() as cluster:
        spec = small_run(tmp_path, cluster)
        prepared = scenario.prepare(spec, clock.now())
        for node in prepared.nodes:
            cluster.put(NODES, node)
        # A pod a crashed run left behind: it holds GPUs until the next run deletes it.
        cluster.put(
            NAMESPACES,
            {
                "metadata": {
                    "name": NAMESPACE,
                    "labels": {remote_pods.OWNER_LABEL: remote_pods.OWNER},
                }
            },
        )
        leftover = {
            "metadata": {
                "name": "old",
                "namespace": NAMESPACE,
                "uid": "u-old",
                "labels": {remote_pods.OWNER_LABEL: remote_pods.OWNER},
            },
            "spec": {"nodeName": "hgx-000", "containers": []},
        }
        cluster.put(PODS, leftover)
        servers = tmp_path / "servers"
        servers.mkdir()
        extender_args = ["--topology-levels", fleet.TOPOLOGY_LEVELS, "--assume-ttl", "120"]
        async with local_servers(
            servers, prepared.policy, cluster.kubeconfig(servers), extender_args, clock
        ) as targets:
            assert spec.remote is not None
            remote = replace(
                spec.remote,
                webhook_url=targets.webhook.url,
                extender_url=targets.extender.url,
                ca=servers / "certs" / "ca.crt",
            )
            result, _ = await scenario.run(replace(spec, remote=remote), clock)

        bound = [p for p in result.pods.values() if p.bound_s is not None]
        assert bound
        assert not result.errors, result.errors
        # Every pod the run scheduled was a pod of the cluster, in the owned namespace,
        # bound there by the extender, with the uid the cluster gave it.
        assert cluster.created == len(result.pods)
        assert cluster.bindings == len(bound)
        assert all(p.key.startswith(f"{NAMESPACE}/") for p in result.pods.values())
        assert all(str(p.obj["metadata"]["uid"]).startswith("mini-") for p in bound)
        # Pods that ended were deleted, and the extender reused their GPUs: more GPU-time
        # was bound than the four nodes hold at once.
        ended = sum(p.ended for p in result.pods.values())
        assert ended > 0
        assert sum(p.gpus + p.milli / 1000 for p in bound) > result.gpus_total
        # Nothing is left: the leftover and the run's pods are gone; the namespace was
        # there before the run, so it stays.
        assert cluster.deleted >= ended + 1
        assert [k for k in cluster.store[PODS] if k.startswith(f"{NAMESPACE}/")] == []
        assert NAMESPACE in cluster.store[NAMESPACES]


async def test_a_namespace_made_by_the_run_goes_with_it(tmp_path: Path) -> None:
    async with MiniApiServer() as cluster:
        spec = small_run(tmp_path, cluster)
        assert spec.remote is not None
        assert spec.remote.kubeconfig is not None
        config = await KubeConfig.from_kubeconfig(spec.remote.kubeconfig)
        async with remote_pods.RemotePods(config, "fresh") as pods:
            labels = cluster.store[NAMESPACES]["fresh"]["metadata"]["labels"]
            assert labels == {remote_pods.OWNER_LABEL: remote_pods.OWNER}
            made = await pods.create(pods.pod_for(fleet_pod()))
            assert made["spec"]["schedulerName"] == remote_pods.SCHEDULER_NAME
            assert made["metadata"]["namespace"] == "fresh"
            assert await pods.missing_nodes(["hgx-000"]) == ["hgx-000"]
        assert "fresh" not in cluster.store[NAMESPACES]
        assert cluster.store[PODS] == {}


async def test_a_namespace_not_ours_or_missing_nodes_refuse_the_run(tmp_path: Path) -> None:
    clock = SystemClock()
    async with MiniApiServer() as cluster:
        cluster.put(NAMESPACES, {"metadata": {"name": NAMESPACE, "labels": {}}})
        spec = small_run(tmp_path, cluster)
        with pytest.raises(remote_pods.RemoteClusterError, match="is not the load test's"):
            await scenario.run(spec, clock)
        assert spec.remote is not None
        other = replace(spec, remote=replace(spec.remote, namespace="lt-other"))
        with pytest.raises(remote_pods.RemoteClusterError, match="4 of the run's 4 nodes"):
            await scenario.run(other, clock)
        assert "lt-other" not in cluster.store[NAMESPACES]  # cleaned up on the way out


def test_remote_urls_without_a_kubeconfig_are_refused(tmp_path: Path) -> None:
    urls = ["--webhook-url", "https://w:443", "--extender-url", "https://e:8888"]
    with pytest.raises(SystemExit, match="needs --kubeconfig"):
        main(["latency", *urls, "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--kubeconfig goes with"):
        main(["latency", "--kubeconfig", "k", "--out", str(tmp_path)])


def fleet_pod() -> dict[str, object]:
    job = fleet.job_object("j", fleet.TEAMS[0])
    return objects.job_pods(job, "x")[0]
