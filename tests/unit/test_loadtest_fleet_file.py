"""The benchmarks' generated fleet (``loadtest.bench.cache.write_fleet``) is a cluster the
extender can read, whose gangs are real gangs: every member of one in one namespace
under one gang id, as a Job's pods are."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from cluster import jsonio, labels
from loadtest.bench.cache import GANG_SIZE, write_fleet


def test_the_members_of_a_gang_share_its_namespace_and_id(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    bound, pending = write_fleet(path, nodes=40, pods=3000, seed=3)
    items = jsonio.loads(path.read_bytes())["items"]
    pods = [item for item in items if item["kind"] == "Pod"]
    assert len(pods) == bound + pending == 3000
    members: dict[str, list[dict[str, object]]] = defaultdict(list)
    for pod in pods:
        gang = pod["metadata"]["labels"].get(labels.GANG)
        if gang is not None:
            members[gang].append(pod)
    assert members, "the fleet has gangs"
    sizes = [len(group) for group in members.values()]
    assert GANG_SIZE in sizes, f"no gang kept all its members together: {sizes}"
    for gang, group in members.items():
        namespaces = {pod["metadata"]["namespace"] for pod in group}  # type: ignore[index]
        assert len(namespaces) == 1, f"gang {gang} spans namespaces {namespaces}"
        assert gang.startswith(f"{namespaces.pop()}.")
        assert len(group) <= GANG_SIZE
