"""``manifests/autoscaling/provisioning.yaml``: the Kueue objects that put autoscaled GPU
nodes behind a ProvisioningRequest admission check hold together, read as the webhook
reads queues, and every field is one Kueue's CRDs know (when the CRDs are at hand)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import labels
from cluster.files import load_objects
from webhook.policy_build import policy_from_objects

ROOT = Path(__file__).resolve().parents[2]
FILE = ROOT / "manifests" / "autoscaling" / "provisioning.yaml"
CRDS = sorted((Path.home() / ".cache" / "tessera").glob("crds-kueue-*"))
OBJECTS = load_objects(FILE)


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [o for o in OBJECTS if o["kind"] == kind]


def test_the_check_names_the_config_and_guards_only_the_autoscaled_flavor() -> None:
    (check,) = by_kind("AdmissionCheck")
    (config,) = by_kind("ProvisioningRequestConfig")
    (flavor,) = by_kind("ResourceFlavor")
    (queue,) = by_kind("ClusterQueue")
    assert check["spec"]["controllerName"] == labels.KUEUE_PROVISIONING_CONTROLLER
    assert check["spec"]["parameters"] == {
        "apiGroup": "kueue.x-k8s.io",
        "kind": "ProvisioningRequestConfig",
        "name": config["metadata"]["name"],
    }
    assert config["spec"]["managedResources"] == ["nvidia.com/gpu"]
    assert queue["spec"]["admissionChecksStrategy"]["admissionChecks"] == [
        {"name": check["metadata"]["name"], "onFlavors": [flavor["metadata"]["name"]]}
    ]


def test_with_the_examples_the_queue_offers_reserved_then_autoscaled_h100s() -> None:
    examples = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
    policy = policy_from_objects([o for p in examples for o in load_objects(p)] + OBJECTS)
    assert policy.problems == ()
    assert policy.cluster_queues["nlp-burst"].gpu_flavors == ("h100-reserved", "h100-autoscaled")
    assert policy.local_queue("team-nlp", "burst") is not None


def _unknown(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    """Fields of ``value`` the CRD's schema does not have, and enum values it refuses."""
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} not in {schema['enum']}"]
    if isinstance(value, Mapping) and "properties" in schema:
        found = []
        for key, inner in value.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}: unknown field")
            else:
                found += _unknown(inner, schema["properties"][key], f"{path}.{key}")
        return found
    if isinstance(value, list) and "items" in schema:
        return [
            e for i, v in enumerate(value) for e in _unknown(v, schema["items"], f"{path}[{i}]")
        ]
    return []


@pytest.mark.skipif(not CRDS, reason="Kueue's CRDs are fetched by tests/e2e/build_binaries.sh")
@pytest.mark.parametrize("obj", OBJECTS, ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_every_field_is_one_kueue_knows(obj: dict[str, Any]) -> None:
    plural = {
        "ResourceFlavor": "resourceflavors",
        "ProvisioningRequestConfig": "provisioningrequestconfigs",
        "AdmissionCheck": "admissionchecks",
        "ClusterQueue": "clusterqueues",
        "LocalQueue": "localqueues",
    }[obj["kind"]]
    crd = yaml.safe_load((CRDS[-1] / f"kueue.x-k8s.io_{plural}.yaml").read_text())
    version = obj["apiVersion"].split("/")[1]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = served["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert _unknown(obj["spec"], schema, "spec") == []
