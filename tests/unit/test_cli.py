"""Environment-backed flags shared by ``python -m webhook`` and ``python -m extender``."""

from __future__ import annotations

import argparse

import pytest

from server.cli import env_bool, env_name
from webhook.__main__ import parse_settings
from webhook.owners import JOB_CONTROLLER_USERNAMES, JOBSET_CONTROLLER_USERNAMES

PREFIX = "TESSERA_WEBHOOK_"
CERTS = ["--tls-cert", "w.crt", "--tls-key", "w.key"]


def test_flag_names_become_variable_names() -> None:
    assert env_name(PREFIX, "tls-cert") == "TESSERA_WEBHOOK_TLS_CERT"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("On", True), ("1", True), ("false", False), ("no", False), ("", False)],
)
def test_switches_read_the_usual_words(value: str, expected: bool) -> None:
    parser = argparse.ArgumentParser(prog="t")
    assert env_bool({PREFIX + "LOG_JSON": value}, PREFIX, "log-json", parser) is expected


def test_an_unset_switch_is_left_to_the_default() -> None:
    assert env_bool({}, PREFIX, "log-json", argparse.ArgumentParser(prog="t")) is None


def test_a_switch_that_is_neither_true_nor_false_exits_naming_the_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stop:
        env_bool({PREFIX + "LOG_JSON": "maybe"}, PREFIX, "log-json", argparse.ArgumentParser("t"))
    assert stop.value.code == 2
    assert "TESSERA_WEBHOOK_LOG_JSON='maybe' is not true or false" in capsys.readouterr().err


@pytest.mark.parametrize(("value", "expected"), [("false", False), ("true", True)])
def test_the_webhook_reads_log_json_as_a_switch(value: str, expected: bool) -> None:
    settings = parse_settings(CERTS, {PREFIX + "LOG_JSON": value})
    assert settings.log_json is expected


def test_a_settings_error_is_one_line_without_pydantic_prefixes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_settings([*CERTS, "--policy-file", "p.yaml", "--kubeconfig", "k"], {})
    err = capsys.readouterr().err
    assert "give --policy-file or --kubeconfig, not both" in err
    assert "Value error" not in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "environ", "job", "jobset"),
    [
        pytest.param([], {}, JOB_CONTROLLER_USERNAMES, JOBSET_CONTROLLER_USERNAMES, id="defaults"),
        pytest.param(
            [],
            {PREFIX + "JOBSET_CONTROLLER_USERNAMES": "system:serviceaccount:jobset:manager, x"},
            JOB_CONTROLLER_USERNAMES,
            ("system:serviceaccount:jobset:manager", "x"),
            id="from-the-environment",
        ),
        pytest.param(
            ["--job-controller-usernames", ""], {}, (), JOBSET_CONTROLLER_USERNAMES, id="unchecked"
        ),
    ],
)
def test_the_controllers_usernames_are_comma_separated_and_may_be_empty(
    argv: list[str], environ: dict[str, str], job: tuple[str, ...], jobset: tuple[str, ...]
) -> None:
    settings = parse_settings([*CERTS, *argv], environ)
    assert (settings.job_controller_usernames, settings.jobset_controller_usernames) == (
        job,
        jobset,
    )
