"""mrc.units: the one size parser and the one rate parser, and their argparse wrappers."""

from __future__ import annotations

import argparse

import pytest

from mrc.cli.common import int_at_least, positive_int, rate_arg, size_arg
from mrc.errors import UsageError
from mrc.units import parse_rate, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1500", 1500),
        ("1500B", 1500),
        ("64M", 64 << 20),  # binary, as dd reads it
        ("64MiB", 64 << 20),
        ("64Mi", 64 << 20),
        ("64MB", 64_000_000),  # decimal
        ("64mb", 64_000_000),
        ("1K", 1024),
        ("1KiB", 1024),
        ("1KB", 1000),
        ("1G", 1 << 30),
        ("1GiB", 1 << 30),
        ("1GB", 10**9),
        ("1.5M", 3 << 19),
        (" 2 k ", 2048),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_mib_and_mb_differ() -> None:
    assert parse_size("64MiB") == 67_108_864
    assert parse_size("64MB") == 64_000_000


@pytest.mark.parametrize("text", ["", "M", "12Q", "-1M", "1 TB", "64 MiBs"])
def test_bad_sizes_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_size(text)
    assert info.value.exit_code == 2
    assert "\n" not in str(info.value)
    with pytest.raises(argparse.ArgumentTypeError):
        size_arg(text)


def test_parse_rate_follows_tc() -> None:
    assert parse_rate("200mbit") == 200_000_000
    assert parse_rate("1gbit") == 10**9
    assert parse_rate("12.5mbps") == 100_000_000  # bytes per second, as tc reads it
    assert parse_rate("100000") == 100_000
    for bad in ("fast", "1mhz", "1bit", "40gbit"):
        with pytest.raises(UsageError):
            parse_rate(bad)
    assert rate_arg("200mbit") == "200mbit"
    with pytest.raises(argparse.ArgumentTypeError):
        rate_arg("fast")


def test_int_validators() -> None:
    assert positive_int("3") == 3
    for bad in ("0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)
    assert int_at_least(0)("0") == 0
