"""The naive extender the benchmark compares against: aiohttp + orjson, free GPUs per island.

Layer: ROOT (a script for ``loadtest.bench.extender``; never imported by the servers).
It is the issue's "naive filter" and nothing more: it reads the same cluster file as
the extender, counts whole free GPUs per NVLink island once at start (bound pods'
``tessera.dev/gpu-indices``), and answers ``/filter`` by comparing the pod's GPU count
with the node's largest island, ``/prioritize`` with the free GPU count, ``/bind`` with
no error. No validation, no topology, no fragmentation, no state change: the floor a
Python server on this machine can reach, measured in the same run.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from cluster import jsonio
from cluster import labels as keys
from cluster.files import load_objects

ISLANDS = ((0, 1, 2, 3), (4, 5, 6, 7))


def _whole(pod: dict[str, Any]) -> int:
    total = 0
    for container in pod.get("spec", {}).get("containers", ()):
        amount = container.get("resources", {}).get("requests", {}).get(keys.GPU_RESOURCE)
        if amount is not None:
            total += int(amount)
    return total


def load(path: str) -> dict[str, tuple[int, int]]:
    """Per node: (largest island's whole free GPUs, whole free GPUs)."""
    used: dict[str, set[int]] = {}
    names: list[str] = []
    for obj in load_objects(path):
        if obj.get("kind") == "Node":
            names.append(obj["metadata"]["name"])
        elif obj.get("kind") == "Pod":
            node = obj.get("spec", {}).get("nodeName")
            indices = obj["metadata"].get("annotations", {}).get(keys.GPU_INDICES)
            if node and indices:
                used.setdefault(node, set()).update(int(i) for i in indices.split(","))
    out: dict[str, tuple[int, int]] = {}
    for name in names:
        taken = used.get(name, set())
        per_island = [sum(1 for i in island if i not in taken) for island in ISLANDS]
        out[name] = (max(per_island), sum(per_island))
    return out


CANNED_REASON = "canned answer: every third node fits"


def create_app(free: dict[str, tuple[int, int]], *, canned: bool = False) -> web.Application:
    async def filter_nodes(request: web.Request) -> web.Response:
        args = jsonio.loads(await request.read())
        if canned:
            names = args["NodeNames"]
            out = {
                "NodeNames": names[::3],
                "FailedNodes": dict.fromkeys(names[1::3] + names[2::3], CANNED_REASON),
                "Error": "",
            }
            return web.Response(body=jsonio.dumps(out), content_type="application/json")
        need = _whole(args["Pod"])
        fits: list[str] = []
        failed: dict[str, str] = {}
        for name in args["NodeNames"]:
            island, _ = free.get(name, (0, 0))
            if island >= need:
                fits.append(name)
            else:
                failed[name] = f"{island} GPUs free in one island, pod needs {need}"
        body = {"NodeNames": fits, "FailedNodes": failed, "Error": ""}
        return web.Response(body=jsonio.dumps(body), content_type="application/json")

    async def prioritize(request: web.Request) -> web.Response:
        args = jsonio.loads(await request.read())
        scores = [
            {"Host": name, "Score": 5 if canned else min(10, free.get(name, (0, 0))[1])}
            for name in args["NodeNames"]
        ]
        return web.Response(body=jsonio.dumps(scores), content_type="application/json")

    async def bind(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b'{"Error":""}', content_type="application/json")

    async def readyz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/filter", filter_nodes)
    app.router.add_post("/prioritize", prioritize)
    app.router.add_post("/bind", bind)
    app.router.add_get("/readyz", readyz)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.baseline_extender")
    parser.add_argument("--cluster-file", required=True)
    parser.add_argument("--port", type=int, default=8889)
    parser.add_argument(
        "--canned", action="store_true", help="answer from the names alone (the floor)"
    )
    args = parser.parse_args(argv)
    free = {} if args.canned else load(args.cluster_file)
    try:
        import uvloop  # noqa: PLC0415 - what the extender runs on, when it is there

        uvloop.install()
    except ImportError:
        pass
    print(f"baseline extender: {len(free)} nodes, pid {os.getpid()}", flush=True)
    web.run_app(create_app(free, canned=args.canned), host="127.0.0.1", port=args.port, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
