"""The extender's settings: what an admin may write, and what is refused with a reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from extender.__main__ import parse_settings
from extender.config import ExtenderConfig, TopologyLevel
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


def test_the_pod_mix_is_learned_and_cpu_strands_half_unless_told_otherwise() -> None:
    settings = ExtenderSettings()
    assert settings.pod_mix == "learned"
    assert settings.pod_mix_interval_s == 60
    assert settings.to_config().cpu_stranding == ExtenderConfig().cpu_stranding == 0.2


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        pytest.param(
            ["--pod-mix", "default", "--pod-mix-interval", "5", "--cpu-stranding", "0.25"],
            {},
            id="flags",
        ),
        pytest.param(
            [],
            {
                "TESSERA_EXTENDER_POD_MIX": "default",
                "TESSERA_EXTENDER_POD_MIX_INTERVAL": "5",
                "TESSERA_EXTENDER_CPU_STRANDING": "0.25",
            },
            id="environment",
        ),
    ],
)
def test_pod_mix_and_cpu_stranding_from_flags_or_environment(
    argv: list[str], environ: dict[str, str]
) -> None:
    settings = parse_settings(argv, environ)
    assert settings.pod_mix == "default"
    assert settings.pod_mix_interval_s == 5
    assert settings.to_config().cpu_stranding == 0.25


@pytest.mark.parametrize(
    ("argv", "environ", "chooses"),
    [
        pytest.param([], {}, False, id="off unless told"),
        pytest.param(["--choose-in-filter"], {}, True, id="flag"),
        pytest.param([], {"TESSERA_EXTENDER_CHOOSE_IN_FILTER": "true"}, True, id="environment"),
        pytest.param(
            ["--no-choose-in-filter"],
            {"TESSERA_EXTENDER_CHOOSE_IN_FILTER": "true"},
            False,
            id="the flag over the environment",
        ),
    ],
)
def test_choosing_in_filter_from_a_flag_or_the_environment(
    argv: list[str], environ: dict[str, str], chooses: bool
) -> None:
    assert parse_settings(argv, environ).to_config().choose_in_filter is chooses


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        pytest.param(["--cpu-stranding", "2"], "cpu_stranding", id="stranding"),
        pytest.param(["--cpu-stranding", "half"], "invalid float value", id="stranding-word"),
        pytest.param(["--pod-mix", "trace"], "'learned' or 'default'", id="pod-mix"),
    ],
)
def test_a_bad_pod_mix_or_stranding_exits_with_one_line(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        parse_settings(argv, {})
    assert stop.value.code == 2
    # argparse puts its usage above a value it cannot even convert; the reason is one line
    reason = capsys.readouterr().err.splitlines()[-1]
    assert reason.startswith("python -m extender: error: ")
    assert said in reason


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
        pytest.param({"cpu_stranding": 1.5}, "less than or equal to 1", id="stranding-above-1"),
        pytest.param({"cpu_stranding": -0.1}, "greater than or equal to 0", id="stranding-below-0"),
        pytest.param({"pod_mix": "sometimes"}, "'learned' or 'default'", id="pod-mix-word"),
        pytest.param({"pod_mix_interval_s": 0}, "greater than 0", id="pod-mix-interval"),
        pytest.param({"max_cache_age_s": -1}, "greater than or equal to 0", id="cache-age-below-0"),
        pytest.param({"max_cache_age_s": 3}, "0 \\(off\\) or at least 6", id="cache-age-too-short"),
    ],
)
def test_refused_settings_say_why(values: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        ExtenderSettings.model_validate(values)


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        pytest.param(["--max-cache-age", "90"], {}, id="flag"),
        pytest.param([], {"TESSERA_EXTENDER_MAX_CACHE_AGE": "90"}, id="environment"),
    ],
)
def test_the_cache_age_limit_from_a_flag_or_the_environment(
    argv: list[str], environ: dict[str, str]
) -> None:
    assert parse_settings(argv, environ).max_cache_age_s == 90


@pytest.mark.parametrize(
    ("limit", "shortest", "longest"),
    [
        pytest.param(30, 10, 20, id="default"),
        pytest.param(90, 30, 60, id="longer"),
        pytest.param(6, 2, 4, id="shortest-allowed"),
        pytest.param(0, 300, 600, id="off"),
    ],
)
def test_a_quiet_watch_ends_and_is_heard_well_within_the_cache_age_limit(
    limit: float, shortest: int, longest: int
) -> None:
    """The informer asks for ``timeoutSeconds`` in [t, 2t): the server ends a quiet watch
    (after a bookmark) before the limit, so a healthy cluster is never taken for stale."""
    settings = ExtenderSettings(max_cache_age_s=limit)
    assert settings.watch_timeout_s == shortest
    assert 2 * settings.watch_timeout_s == longest
    if limit:
        assert longest <= limit * 2 / 3


def test_the_cache_may_be_30_s_old_unless_told_otherwise() -> None:
    assert ExtenderSettings().max_cache_age_s == 30


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
