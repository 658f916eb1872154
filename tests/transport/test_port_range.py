"""mrc.transport.ports: parsing --ports and binding inside a range, on loopback."""

from __future__ import annotations

import socket

import pytest

from mrc.transport.ports import PortRange, RangeExhausted, bind_in_range
from mrc.transport.sockets import udp_socket


@pytest.mark.parametrize(
    ("text", "expected"),
    [("40000-40999", (40000, 40999)), (" 5000-5000 ", (5000, 5000)), ("6000", (6000, 6000))],
)
def test_a_range_parses(text: str, expected: tuple[int, int]) -> None:
    r = PortRange.parse(text)
    assert (r.lo, r.hi) == expected and len(r) == expected[1] - expected[0] + 1
    assert str(PortRange.parse(str(r))) == str(r)


@pytest.mark.parametrize("text", ["", "a-b", "0-10", "10-5", "1-65536", "-5", "5-", "1-2-3"])
def test_a_bad_range_is_one_line(text: str) -> None:
    with pytest.raises(ValueError) as err:
        PortRange.parse(text)
    assert "\n" not in str(err.value) and repr(text) in str(err.value)


def _free_block(size: int) -> PortRange:
    """``size`` consecutive UDP ports on ::1 that are free now (best effort: a neighbour may
    take one, which the tests below tolerate by asking for fewer than the block)."""
    for lo in range(21000, 29000, 97):
        socks = []
        try:
            for p in range(lo, lo + size):
                s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("::1", p))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return PortRange(lo, lo + size - 1)
    pytest.skip("no block of free UDP ports on ::1")


def test_sockets_take_distinct_ports_of_the_range_until_none_is_left() -> None:
    r = _free_block(8)
    socks = []
    try:
        for _ in range(8):
            socks.append(udp_socket("::1", 0, ports=r))
        ports = sorted(s.getsockname()[1] for s in socks)
        assert ports == list(range(r.lo, r.hi + 1))
        with pytest.raises(RangeExhausted, match=f"no free UDP port in the range {r}"):
            udp_socket("::1", 0, ports=r)
    finally:
        for s in socks:
            s.close()


def test_avoided_ports_are_not_taken() -> None:
    r = _free_block(4)
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        port = bind_in_range(s, "::1", r, avoid={r.lo, r.lo + 1, r.lo + 2})
        assert port == r.hi == s.getsockname()[1]
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s, pytest.raises(RangeExhausted):
        bind_in_range(s, "::1", r, avoid=set(range(r.lo, r.hi + 1)))
