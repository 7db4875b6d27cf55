"""Ports for the servers the tests and benchmarks start: never one the kernel may hand to
an outbound connection, never the same one twice, always free when given."""

from __future__ import annotations

import random
import socket

import pytest

from loadtest.ports import LOOPBACK, LOWEST, PortPicker, quiet_ports


@pytest.mark.parametrize(
    ("ephemeral", "expected"),
    [
        ("32768\t60999\n", range(LOWEST, 32768)),  # Linux's default: below it
        ("49152 65535", range(LOWEST, 49152)),  # the IANA range
        ("1024 60999", range(61000, 65536)),  # starts low: above it
        ("1024 65535", None),  # everything is ephemeral: the kernel's choice
        ("11000 64000", None),  # neither side has room enough
    ],
)
def test_ports_come_from_outside_the_ephemeral_range(
    ephemeral: str, expected: range | None
) -> None:
    assert quiet_ports(ephemeral) == expected


def test_a_picker_never_gives_a_port_twice_nor_one_in_use() -> None:
    span = range(40000, 40064)
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 40007))
        taken.listen()
        picker = PortPicker(span, random.Random(7))
        given = [picker.pick() for _ in range(40)]
    assert len(set(given)) == len(given)
    assert 40007 not in given
    assert all(port in span for port in given)


def test_a_span_with_no_free_port_falls_back_to_the_kernels_choice() -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        held = taken.getsockname()[1]
        picker = PortPicker(range(held, held + 1), random.Random(7))
        first, second = picker.pick(), picker.pick()
    assert held not in (first, second)
    assert first != second
    with socket.socket() as sock:
        sock.bind((LOOPBACK, second))  # free when given
