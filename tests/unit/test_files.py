"""Objects from the files an admin would ``kubectl apply`` or ``kubectl get -o yaml``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import jsonio
from cluster import labels as keys
from cluster.convert.nodes import node_from_json
from cluster.convert.pods import pod_from_json
from cluster.files import ObjectFileError, load_objects, load_objects_from_bytes
from tests.builders import node_json, pod_json

MULTI_DOC = b"""\
# the cluster of the demo
apiVersion: v1
kind: Node
metadata:
  name: gpu-a
  labels:
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
  annotations:
    tessera.dev/nvlink-islands: 0-3,4-7
    tessera.dev/drain-after: 2026-12-01T02:00:00Z
status:
  allocatable:
    nvidia.com/gpu: "8"
    cpu: 64
    memory: 512Gi
---
---
# only a comment
---
apiVersion: v1
kind: Pod
metadata:
  name: notebook
  namespace: team-nlp
spec:
  schedulerName: tessera-gpu
  containers:
  - name: nb
    image: jupyter
    resources:
      limits:
        nvidia.com/gpu: 1
...
"""


def _kinds(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in objects]


def test_multi_document_yaml_skips_empty_documents() -> None:
    objects = load_objects_from_bytes(MULTI_DOC, "cluster.yaml")
    assert _kinds(objects) == [("Node", "gpu-a"), ("Pod", "notebook")]


def test_yaml_values_reach_conversion_as_the_api_would_send_them() -> None:
    node_obj, pod_obj = load_objects_from_bytes(MULTI_DOC, "cluster.yaml")
    # an unquoted timestamp stays text, as in the API's JSON
    assert node_obj["metadata"]["annotations"][keys.DRAIN_AFTER] == "2026-12-01T02:00:00Z"
    node = node_from_json(node_obj)
    assert node.drain_after is not None
    assert [g.island for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert node.cpu_milli == 64000  # an unquoted YAML number is a quantity too
    assert node.problems == ()
    assert pod_from_json(pod_obj).demand.gpus == 1


def test_json_file() -> None:
    data = jsonio.dumps(node_json("gpu-b"))
    assert _kinds(load_objects_from_bytes(data, "node.json")) == [("Node", "gpu-b")]


def test_json_without_a_json_name_is_still_read_as_json() -> None:
    data = jsonio.dumps_pretty(pod_json("p-1"))
    assert _kinds(load_objects_from_bytes(data, "pod.yaml")) == [("Pod", "p-1")]


def test_kubectl_get_list_is_flattened() -> None:
    listing = {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": [node_json("gpu-a"), node_json("gpu-b"), pod_json("train-0", gpus=4)],
    }
    for data, name in (
        (yaml.safe_dump(listing).encode(), "get.yaml"),
        (jsonio.dumps(listing), "get.json"),
    ):
        objects = load_objects_from_bytes(data, name)
        assert _kinds(objects) == [("Node", "gpu-a"), ("Node", "gpu-b"), ("Pod", "train-0")]


def test_typed_list_items_get_their_kind() -> None:
    items = [node_json("gpu-a"), node_json("gpu-b")]
    for item in items:
        del item["kind"], item["apiVersion"]  # the API leaves them off typed list items
    listing = {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items}
    objects = load_objects_from_bytes(jsonio.dumps(listing), "nodes.json")
    assert [(o["kind"], o["apiVersion"]) for o in objects] == [("Node", "v1"), ("Node", "v1")]


def test_lists_inside_a_multi_document_file_and_empty_lists() -> None:
    data = b"""\
kind: List
apiVersion: v1
items: []
---
kind: PodList
apiVersion: v1
items: null
---
kind: List
apiVersion: v1
items:
- kind: List
  apiVersion: v1
  items:
  - {kind: Pod, apiVersion: v1, metadata: {name: inner}}
"""
    assert _kinds(load_objects_from_bytes(data, "lists.yaml")) == [("Pod", "inner")]


def test_top_level_sequence_holds_objects() -> None:
    data = jsonio.dumps([node_json("gpu-a"), pod_json("p")])
    assert _kinds(load_objects_from_bytes(data, "two.json")) == [("Node", "gpu-a"), ("Pod", "p")]


def test_empty_file_has_no_objects() -> None:
    assert load_objects_from_bytes(b"", "empty.yaml") == []
    assert load_objects_from_bytes(b"---\n# nothing\n---\n", "empty.yaml") == []


BAD = [
    pytest.param(
        b"kind: Node\nmetadata: {name: a}\n---\nkind: Pod\nmetadata: {name: [b\n",
        "cluster.yaml: document 2: not valid YAML at line",
        id="bad-yaml-in-second-document",
    ),
    pytest.param(
        b"kind: Node\n  metadata: x\n: y\n",
        "cluster.yaml: document 1: not valid YAML at line",
        id="bad-indentation",
    ),
    pytest.param(
        b"kind: Node\nmetadata: {name: a}\n---\njust a string\n",
        "cluster.yaml: document 2: expected a Kubernetes object, got str 'just a string'",
        id="scalar-document",
    ),
    pytest.param(
        b"metadata: {name: a}\n",
        "cluster.yaml: document 1: the object has no kind",
        id="no-kind",
    ),
    pytest.param(
        b"kind: List\nitems:\n- kind: Node\n- 42\n",
        "cluster.yaml: document 1, item 2: expected a Kubernetes object, got int 42",
        id="bad-list-item",
    ),
]


@pytest.mark.parametrize(("data", "message"), BAD)
def test_errors_name_the_file_and_the_document(data: bytes, message: str) -> None:
    with pytest.raises(ObjectFileError) as caught:
        load_objects_from_bytes(data, "cluster.yaml")
    assert str(caught.value).startswith(message)


def test_bad_json_names_the_file() -> None:
    with pytest.raises(ObjectFileError, match=r"^nodes\.json: not valid JSON"):
        load_objects_from_bytes(b'{"kind": "Node",', "nodes.json")


def test_load_objects_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    nodes = [node_json(f"gpu-{i}", rack=f"r{i % 4}") for i in range(20)]
    pods = [pod_json(f"train-{i}", gpus=1 + i % 8, node=f"gpu-{i % 20}") for i in range(200)]
    path.write_text(yaml.safe_dump_all([*nodes, *pods]))
    objects = load_objects(path)
    assert len(objects) == 220
    assert [node_from_json(o).name for o in objects[:20]] == [f"gpu-{i}" for i in range(20)]
    assert sum(pod_from_json(o).demand.gpus for o in objects[20:]) == sum(
        1 + i % 8 for i in range(200)
    )


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ObjectFileError, match=r"absent\.yaml: cannot read"):
        load_objects(path)
