"""A route's socket mark (uSID fabrics pick a spine's encapsulation table by it): set on every
EV socket of the route, and without CAP_NET_ADMIN a one-line reason, not a bare EPERM."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from nobody import NOBODY, why_nobody_cannot_run_mrc

from mrc.srv6.evroutes import EVRoute
from mrc.transport.evsockets import open_ev_sockets

MARK = 0x4D52_0001


def test_every_socket_of_a_marked_route_carries_the_mark() -> None:
    if os.geteuid() != 0:
        pytest.skip("SO_MARK needs CAP_NET_ADMIN")
    routes = [[EVRoute(0, "::1", "::1", None, "r0", mark=MARK)]]
    evs = open_ev_sockets(8, routes, 9)
    try:
        assert evs.sockets
        assert {s.getsockopt(socket.SOL_SOCKET, socket.SO_MARK) for s in evs.sockets} == {MARK}
    finally:
        evs.close()
    plain = open_ev_sockets(4, [[EVRoute(0, "::1", "::1", None, "r0")]], 9)
    try:
        assert {s.getsockopt(socket.SOL_SOCKET, socket.SO_MARK) for s in plain.sockets} == {0}
    finally:
        plain.close()


def test_without_cap_net_admin_the_reason_is_one_line() -> None:
    why_not = why_nobody_cannot_run_mrc()
    if why_not is not None:
        pytest.skip(why_not)
    code = (
        "from mrc.errors import MRCError\n"
        "from mrc.srv6.evroutes import EVRoute\n"
        "from mrc.transport.evsockets import open_ev_sockets\n"
        f"r = [[EVRoute(0, '::1', '::1', None, 'r0', mark={MARK})]]\n"
        "try:\n"
        "    open_ev_sockets(4, r, 9)\n"
        "except MRCError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run(
        [*NOBODY, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "cannot open EV sockets: a uSID fabric's routes pick their spine by socket mark"
        " (SO_MARK), which needs CAP_NET_ADMIN"
    ), done.stdout
