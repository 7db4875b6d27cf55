"""The extender's settings: what an admin may write, and what is refused with a reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from extender.config import TopologyLevel
from extender.settings import ExtenderSettings, is_loopback, parse_levels

CERT = {"tls_cert": Path("tls.crt"), "tls_key": Path("tls.key")}


def test_levels_from_the_flag_reach_the_decisions() -> None:
    settings = ExtenderSettings.model_validate(
        {
            "topology_levels": "block=example.com/block, rack=example.com/rack,"
            "hostname=kubernetes.io/hostname",
            "weight_packing": 3,
            "strict_islands": False,
        }
    )
    config = settings.to_config()
    assert config.levels == (
        TopologyLevel("block", "example.com/block"),
        TopologyLevel("rack", "example.com/rack"),
        TopologyLevel("hostname", "kubernetes.io/hostname"),
    )
    assert config.weights.packing == 3
    assert config.islands_required is False


@pytest.mark.parametrize(
    ("values", "host"),
    [
        pytest.param({}, "127.0.0.1", id="plain-http-stays-on-loopback"),
        pytest.param(CERT, "0.0.0.0", id="tls-serves-the-pod-network"),
        pytest.param({"host": "::1"}, "::1", id="ipv6-loopback"),
        pytest.param({"host": "0.0.0.0", "insecure_bind_any": True}, "0.0.0.0", id="explicit"),
    ],
)
def test_where_it_listens(values: dict[str, Any], host: str) -> None:
    assert ExtenderSettings.model_validate(values).listen_host == host


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        pytest.param({"host": "0.0.0.0"}, "refusing plain HTTP", id="plain-http-exposed"),
        pytest.param({"host": "scheduler.local"}, "refusing plain HTTP", id="a-name"),
        pytest.param({"tls_cert": Path("a.crt")}, "go together", id="cert-without-key"),
        pytest.param({"client_ca": Path("ca.crt")}, "mutual TLS", id="client-ca-without-tls"),
        pytest.param(
            {"cluster_file": Path("c.yaml"), "kubeconfig": Path("k")}, "not both", id="two-sources"
        ),
        pytest.param({"topology_levels": "rack"}, "<name>=<node label>", id="level-no-label"),
        pytest.param({"topology_levels": ","}, "at least one", id="no-levels"),
        pytest.param({"topology_levels": "a=x/rack,b=x/rack"}, "distinct", id="level-label-twice"),
        pytest.param(
            {"weight_packing": 0, "weight_island_fit": 0, "weight_gang_locality": 0},
            "not all 0",
            id="all-weights-zero",
        ),
        pytest.param({"weight_packing": -1}, "greater than or equal", id="negative-weight"),
        pytest.param({"assume_ttl_s": 0}, "greater than", id="no-ttl"),
        pytest.param({"port": 70000}, "less than or equal", id="port"),
    ],
)
def test_refused_settings_say_why(values: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        ExtenderSettings.model_validate(values)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("localhost", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("", False),
        ("10.0.0.1", False),
        ("localhost.evil", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_levels_parse_widest_first() -> None:
    assert parse_levels("rack=r, hostname=h") == (("rack", "r"), ("hostname", "h"))
