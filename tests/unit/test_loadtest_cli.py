"""``python -m loadtest``'s ways into the benchmarks: their own flags, untouched."""

from __future__ import annotations

import pytest

from loadtest.__main__ import main


@pytest.mark.parametrize(
    ("command", "prog"),
    [
        ("bench-webhook", "python -m loadtest.bench_webhook"),
        ("bench-extender", "python -m loadtest.bench_extender"),
        ("overload", "python -m loadtest overload"),
    ],
)
def test_bench_subcommands_hand_their_arguments_to_the_benchmark(
    command: str, prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {prog}")


def test_the_top_level_help_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "bench-webhook" in out
    assert "python -m loadtest bench-extender --help" in out
    assert "python -m loadtest overload --server webhook" in out
