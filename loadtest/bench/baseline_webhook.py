"""The yardstick for the webhook benchmark: the least an AdmissionReview server can do.

Layer: ROOT (a server of its own: reads argv, serves TLS). ``python -m
loadtest.bench.baseline_webhook --port P --tls-cert F --tls-key F`` serves ``POST /mutate``
with the same stack as ``python -m webhook`` (aiohttp on uvloop, orjson, the TLS context
of ``server.tls``, no access log) but no policy: it decodes the review, takes its uid
and answers with one fixed JSON Patch. Whatever the real webhook costs above this is the
cost of its decisions; quoting the webhook as a ratio of this server, measured in the same
run on the same core, keeps the figures meaningful on a shared, noisy machine. Must not
import ``webhook``: the point is to leave all of it out.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import sys
from collections.abc import Sequence
from typing import Final

import uvloop
from aiohttp import web

from cluster import jsonio
from server.tls import server_context

# About what the webhook writes for the captured Job, so that answers are of similar size:
# suspend, the priority label, gang label and annotations, the scheduler and a time limit.
FIXED_PATCH: Final = base64.b64encode(
    jsonio.dumps(
        [
            {"op": "add", "path": "/spec/suspend", "value": True},
            {
                "op": "add",
                "path": "/metadata/labels/kueue.x-k8s.io~1priority-class",
                "value": "batch-low",
            },
            {
                "op": "add",
                "path": "/spec/template/metadata/labels",
                "value": {"tessera.dev/gang": "team-nlp.finetune-abcde"},
            },
            {
                "op": "add",
                "path": "/spec/template/metadata/annotations",
                "value": {"tessera.dev/gang-size": "2", "tessera.dev/gang-min": "2"},
            },
            {"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 14400},
            {"op": "add", "path": "/spec/template/spec/activeDeadlineSeconds", "value": 14400},
        ]
    )
).decode("ascii")


def _bad_request(message: str) -> web.Response:
    return web.Response(status=400, text=message)


async def mutate(request: web.Request) -> web.Response:
    try:
        review = jsonio.loads(await request.read())
        uid = review["request"]["uid"]
    except (jsonio.JsonError, KeyError, TypeError):
        return _bad_request("not an AdmissionReview")
    answer = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": True, "patchType": "JSONPatch", "patch": FIXED_PATCH},
    }
    return web.Response(body=jsonio.dumps(answer), content_type="application/json")


async def ready(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def create_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/readyz", ready)
    app.router.add_get("/healthz", ready)
    return app


async def serve(host: str, port: int, cert: str, key: str) -> None:
    runner = web.AppRunner(create_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=server_context(cert, key))
    await site.start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench.baseline_webhook",
        description="A bare AdmissionReview server (decode, fixed patch): the benchmark's "
        "yardstick.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.host, args.port, args.tls_cert, args.tls_key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
