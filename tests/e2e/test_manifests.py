"""Scenario 6: what a cluster admin applies from ``manifests/`` is accepted by a real
kube-apiserver (server-side dry run, so admission and the CRDs' schemas judge it), and the
example jobs meet the webhook registered from ``manifests/``: each is mutated as its comment
says, and the over-quota one is refused with Tessera's message.

The namespaces the manifests put objects in are created for real first: a dry run creates
nothing, so without them every namespaced object would fail with "namespace not found".
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio, labels
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.install import EXAMPLES, MANIFESTS, has_kustomization, render, yaml_files
from loadtest.stack.jobs import to_yaml

pytestmark = pytest.mark.e2e

EXAMPLE_JOBS = EXAMPLES / "jobs"
MEANT_TO_BE_DENIED = frozenset({"over-quota.yaml"})


def _source(folder: Path) -> tuple[str, str]:
    return ("-k", str(folder)) if has_kustomization(folder) else ("-f", str(folder))


def _create_namespaces(e2e: E2ECluster, objects: list[dict[str, Any]]) -> None:
    namespaces = [o for o in objects if o.get("kind") == "Namespace"]
    if namespaces:
        e2e.kubectl("apply", "-f", "-", stdin=to_yaml(*namespaces))


def _dry_run_apply(e2e: E2ECluster, folder: Path) -> str:
    done = e2e.kubectl("apply", "--dry-run=server", *_source(folder), check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def install_objects(e2e: E2ECluster) -> list[dict[str, Any]]:
    if not has_kustomization(MANIFESTS) and not yaml_files(MANIFESTS):
        pytest.skip("manifests/ not written yet")
    return render(MANIFESTS, e2e.kubectl_path)


def test_every_install_manifest_applies_with_server_side_dry_run(
    e2e: E2ECluster, install_objects: list[dict[str, Any]]
) -> None:
    _create_namespaces(e2e, install_objects)

    printed = _dry_run_apply(e2e, MANIFESTS)

    # kubectl prints one line per object: every object of the install was accepted
    assert printed.count("(server dry run)") == len(install_objects), printed
    # and the suite's servers ran all along as the install's ServiceAccounts, so its RBAC
    # was enough for the webhook's watches, the extender's binds and kube-scheduler
    assert set(e2e.install.identities) == {"webhook", "extender"}


def _dry_run_create(e2e: E2ECluster, path: Path) -> tuple[int, str, str]:
    done = e2e.kubectl("create", "--dry-run=server", "-o", "json", "-f", str(path), check=False)
    return done.returncode, done.stdout, done.stderr


def _queue_known(e2e: E2ECluster, path: Path) -> tuple[int, str, str] | None:
    """The webhook's answer once its watch has the example queues (it denies a job whose
    queue it does not know yet)."""
    answer = _dry_run_create(e2e, path)
    return None if "does not exist" in answer[2] else answer


def _assert_mutated(obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    assert labels.PRIORITY_CLASS in meta["labels"]
    if obj["kind"] == "Pod":
        gates = [g["name"] for g in obj["spec"].get("schedulingGates") or []]
        assert labels.KUEUE_ADMISSION_GATE in gates
        assert obj["spec"]["schedulerName"] == labels.DEFAULT_SCHEDULER_NAME
        return
    spec = obj["spec"]
    template = spec["template"]
    assert spec["suspend"] is True
    assert template["spec"]["schedulerName"] == labels.DEFAULT_SCHEDULER_NAME
    assert template["spec"]["activeDeadlineSeconds"] > 0
    if (spec.get("parallelism") or 1) > 1:
        assert labels.GANG in template["metadata"]["labels"]
        assert template["metadata"]["annotations"][labels.GANG_SIZE] == str(spec["parallelism"])


def test_the_examples_are_accepted_and_the_example_jobs_mutated_or_denied(
    e2e: E2ECluster,
) -> None:
    if not EXAMPLE_JOBS.is_dir():
        pytest.skip("manifests/examples/ not written yet")
    # the webhook under test is the one an admin installs, not the suite's stand-in
    assert e2e.install.webhook_source == "manifests/"
    examples = render(EXAMPLES, e2e.kubectl_path)
    _create_namespaces(e2e, examples)

    printed = _dry_run_apply(e2e, EXAMPLES)
    assert printed.count("(server dry run)") == len(examples), printed
    e2e.kubectl("apply", *_source(EXAMPLES))
    jobs = yaml_files(EXAMPLE_JOBS)
    first_allowed = next(p for p in jobs if p.name not in MEANT_TO_BE_DENIED)
    e2e.api.wait(
        "the webhook to see the example queues",
        functools.partial(_queue_known, e2e, first_allowed),
        timeout=30,
    )

    for path in jobs:
        code, stdout, stderr = _dry_run_create(e2e, path)
        if path.name in MEANT_TO_BE_DENIED:
            assert code != 0, f"{path.name} was accepted"
            assert any(
                f'admission webhook "{w}" denied the request: ' in stderr
                for w in e2e.install.webhook_names
            ), stderr
            assert "can get at most" in stderr
        else:
            assert code == 0, f"{path.name}: {stderr}"
            _assert_mutated(jsonio.loads(stdout))
