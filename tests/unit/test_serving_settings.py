"""The serving flags both servers share: the same names, each server's variables, the
defaults each server needs, and refusals that say why."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from extender.__main__ import parse_settings as extender_settings
from server.serving_settings import MIB, Limits, ServingSettings
from webhook.__main__ import parse_settings as webhook_settings

CERTS = ["--tls-cert", "w.crt", "--tls-key", "w.key"]

Parse = Callable[[Sequence[str], Mapping[str, str]], ServingSettings]


def webhook(argv: Sequence[str], environ: Mapping[str, str]) -> ServingSettings:
    return webhook_settings([*CERTS, *argv], environ)


SERVERS = [
    pytest.param(webhook, "TESSERA_WEBHOOK_", id="webhook"),
    pytest.param(extender_settings, "TESSERA_EXTENDER_", id="extender"),
]

FLAGS = [
    "--metrics-host=0.0.0.0",
    "--metrics-port=9100",
    "--header-timeout=3",
    "--body-timeout=4",
    "--max-in-flight=7",
    "--max-body-bytes=1048576",
    "--max-buffered-body-bytes=8388608",
    "--request-timeout=2.5",
    "--deadline-margin=0.2",
    "--shutdown-grace=6",
    "--idle-timeout=75",
]
EXPECTED: dict[str, Any] = {
    "metrics_host": "0.0.0.0",
    "metrics_port": 9100,
    "header_timeout_s": 3.0,
    "body_timeout_s": 4.0,
    "max_in_flight": 7,
    "max_body_bytes": MIB,
    "max_buffered_body_bytes": 8 * MIB,
    "request_timeout_s": 2.5,
    "deadline_margin_s": 0.2,
    "shutdown_grace_s": 6.0,
    "idle_timeout_s": 75.0,
}


@pytest.mark.parametrize(("parse", "prefix"), SERVERS)
def test_every_serving_flag_is_read_from_the_command_line_or_the_environment(
    parse: Parse, prefix: str
) -> None:
    from_flags = parse(FLAGS, {})
    environ = {
        prefix + flag[2:].split("=")[0].upper().replace("-", "_"): flag.split("=")[1]
        for flag in FLAGS
    }
    from_environment = parse([], environ)
    for settings in (from_flags, from_environment):
        assert {k: getattr(settings, k) for k in EXPECTED} == EXPECTED
    assert from_flags.limits() == Limits(
        header_timeout_s=3.0,
        body_timeout_s=4.0,
        max_in_flight=7,
        max_buffered_body_bytes=8 * MIB,
        max_body_bytes=MIB,
        deadline_margin_s=0.2,
        idle_timeout_s=75.0,
    )


@pytest.mark.parametrize(
    ("parse", "metrics_port", "request_timeout", "body", "budget"),
    [
        pytest.param(webhook, 0, 10.0, 3 * MIB, 32 * MIB, id="webhook"),
        pytest.param(extender_settings, 0, 5.0, 64 * MIB, 128 * MIB, id="extender"),
    ],
)
def test_each_server_has_the_defaults_its_client_needs(
    parse: Parse, metrics_port: int, request_timeout: float, body: int, budget: int
) -> None:
    settings = parse([], {})
    assert settings.metrics_port == metrics_port  # no listener unless asked for
    assert settings.metrics_host == "127.0.0.1"
    assert settings.request_timeout_s == request_timeout
    assert (settings.max_body_bytes, settings.max_buffered_body_bytes) == (body, budget)
    assert (settings.header_timeout_s, settings.body_timeout_s) == (10.0, 10.0)


@pytest.mark.parametrize(("parse", "prefix"), SERVERS)
@pytest.mark.parametrize(
    ("argv", "said"),
    [
        pytest.param(
            ["--max-body-bytes=4194304", "--max-buffered-body-bytes=1048576"],
            "must hold at least one body",
            id="budget-below-one-body",
        ),
        pytest.param(
            ["--request-timeout=1", "--deadline-margin=1"],
            "--deadline-margin must be shorter than --request-timeout",
            id="margin-eats-the-deadline",
        ),
        pytest.param(["--header-timeout=0"], "header_timeout_s", id="no-head-deadline"),
        pytest.param(["--max-in-flight=0"], "max_in_flight", id="nothing-in-flight"),
        pytest.param(["--metrics-port=70000"], "metrics_port", id="port"),
    ],
)
def test_incoherent_serving_settings_exit_with_one_line(
    parse: Parse,
    prefix: str,
    argv: list[str],
    said: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stop:
        parse(argv, {})
    assert stop.value.code == 2
    reason = capsys.readouterr().err.splitlines()[-1]
    assert said in reason
