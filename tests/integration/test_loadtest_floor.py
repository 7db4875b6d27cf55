"""The benchmark's floor (``loadtest.bench.baseline_extender --canned``) on a real socket.

What a performance engineer relies on when ``bench-extender`` prints the floor: the
server speaks kube-scheduler's extender wire, and its answers have the sizes of a real
extender's (a third of the names fit, every other name is reported failed, every
fitting node gets a score), so the load generator does the same work per pod for it as
for the extender, and the latency it shows is the machine's and the client's alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from cluster import jsonio
from extender.wire import (
    ExtenderBindingResultModel,
    ExtenderFilterResultModel,
    HostPriorityModel,
)
from loadtest.bench.baseline_extender import CANNED_REASON, create_app
from tests.builders import pod_json
from tests.processes import serve_app

NAMES = [f"gpu-{i:03d}" for i in range(10)]


@pytest.fixture
async def floor_url() -> AsyncIterator[str]:
    async with serve_app(create_app({}, canned=True)) as url:
        yield url


async def _post(url: str, body: object) -> bytes:
    async with aiohttp.ClientSession() as session, session.post(url, data=jsonio.dumps(body)) as r:
        assert r.status == 200
        assert r.content_type == "application/json"
        return await r.read()


async def test_filter_passes_every_third_name_and_reports_the_others(floor_url: str) -> None:
    args = {"Pod": pod_json("p", gpus=8), "NodeNames": NAMES}
    result = ExtenderFilterResultModel.model_validate_json(await _post(f"{floor_url}/filter", args))
    assert result.NodeNames == ["gpu-000", "gpu-003", "gpu-006", "gpu-009"]
    assert result.FailedNodes is not None
    assert sorted(result.FailedNodes) == sorted(set(NAMES) - set(result.NodeNames))
    assert set(result.FailedNodes.values()) == {CANNED_REASON}
    assert not result.Error


async def test_prioritize_scores_every_name_it_is_given(floor_url: str) -> None:
    fits = ["gpu-000", "gpu-003", "gpu-006"]
    raw = jsonio.loads(
        await _post(f"{floor_url}/prioritize", {"Pod": pod_json("p"), "NodeNames": fits})
    )
    hosts = [HostPriorityModel.model_validate(item) for item in raw]
    assert [(h.Host, h.Score) for h in hosts] == [(name, 5) for name in fits]


async def test_bind_answers_without_error(floor_url: str) -> None:
    binding = {"PodName": "p", "PodNamespace": "team-a", "PodUID": "u", "Node": "gpu-000"}
    result = ExtenderBindingResultModel.model_validate_json(
        await _post(f"{floor_url}/bind", binding)
    )
    assert not result.Error
