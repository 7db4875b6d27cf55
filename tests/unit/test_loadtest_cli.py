"""``python -m loadtest``'s ways into the benchmarks: their own flags, untouched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.__main__ import main


@pytest.mark.parametrize(
    ("command", "prog"),
    [
        ("bench-webhook", "python -m loadtest.bench.webhook"),
        ("bench-webhook --against kueue", "python -m loadtest bench-webhook --against kueue"),
        ("bench-extender", "python -m loadtest.bench.extender"),
        ("overload", "python -m loadtest overload"),
        ("reservations", "python -m loadtest reservations"),
    ],
)
def test_bench_subcommands_hand_their_arguments_to_the_benchmark(
    command: str, prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command.split(), "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {prog}")


def test_the_top_level_help_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "bench-webhook" in out
    assert "python -m loadtest bench-extender --help" in out
    assert "python -m loadtest overload --server webhook" in out


def test_against_kueue_without_the_binaries_says_how_to_get_them(tmp_path: Path) -> None:
    # an empty cache and no Go to build with: what a new checkout without `make
    # e2e-assets` has
    environ = {k: v for k, v in os.environ.items() if k != "KUBEBUILDER_ASSETS"}
    environ |= {"TESSERA_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "loadtest", "bench-webhook", "--against", "kueue"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "make e2e-assets" in done.stderr
    assert not done.stdout
