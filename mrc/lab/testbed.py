"""Two hosts in network namespaces joined by several veth links: the smallest multi-plane setup.

Each link is one plane: host A has ``fd00:<plane+1>::1`` and host B ``fd00:<plane+1>::2`` on it.
The demo, the tests and the benchmark use this when they need two real hosts but not a whole
fabric (``mrc-fabric`` builds that). Everything it creates carries the prefix it was given and
is removed by :meth:`TwoHosts.destroy`, also after a failure half-way through set-up. A failed
step raises :class:`~mrc.errors.MRCError` naming the command and what it printed.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass, field

from mrc.errors import MRCError


def netns_available() -> str | None:
    """None if namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and veth links)"
    name = f"mrcprobe-{uuid.uuid4().hex[:8]}"
    try:
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    except FileNotFoundError:
        return "the ip command (iproute2) is not installed"
    except subprocess.CalledProcessError as exc:
        return f"cannot create a network namespace: {exc.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise MRCError(f"{' '.join(cmd)}: {res.stderr.strip()}")


def _sysctl(ns: str, *settings: str) -> None:
    cmd = ["ip", "netns", "exec", ns, "sysctl", "-q", "-w", *settings]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise MRCError(f"sysctl in {ns}: {res.stderr.strip()}")


@dataclass
class TwoHosts:
    prefix: str
    links: int = 2
    mtu: int = 9000
    rate: str | None = None  # e.g. "500mbit": tbf on both ends of every link
    a: str = field(init=False)
    b: str = field(init=False)
    a_addrs: list[str] = field(init=False, default_factory=list)
    b_addrs: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.a = f"{self.prefix}-a"
        self.b = f"{self.prefix}-b"

    def link_names(self, plane: int) -> tuple[str, str]:
        """Interface names of plane ``plane`` in A and in B."""
        return (f"p{plane}a", f"p{plane}b")

    def create(self) -> TwoHosts:
        try:
            self._create()
        except BaseException:
            self.destroy()
            raise
        return self

    def _create(self) -> None:
        for ns in (self.a, self.b):
            _ip("netns", "add", ns)
            _sysctl(
                ns,
                "net.ipv6.conf.all.keep_addr_on_down=1",
                "net.ipv6.conf.default.keep_addr_on_down=1",
                "net.ipv6.conf.all.accept_dad=0",
                "net.ipv6.conf.default.accept_dad=0",
            )
            _ip("link", "set", "lo", "up", ns=ns)
        for plane in range(self.links):
            ia, ib = self.link_names(plane)
            _ip(
                "link",
                "add",
                ia,
                "netns",
                self.a,
                "type",
                "veth",
                "peer",
                "name",
                ib,
                "netns",
                self.b,
            )
            aa, ab = f"fd00:{plane + 1}::1", f"fd00:{plane + 1}::2"
            for ns, ifname, addr in ((self.a, ia, aa), (self.b, ib, ab)):
                _ip("link", "set", ifname, "mtu", str(self.mtu), "up", ns=ns)
                _ip("addr", "add", f"{addr}/64", "dev", ifname, "nodad", ns=ns)
                if self.rate:
                    _tc_rate(ns, ifname, self.rate)
            self.a_addrs.append(aa)
            self.b_addrs.append(ab)

    def destroy(self) -> None:
        """Remove both namespaces (their veth links go with them). Safe to call twice."""
        for ns in (self.a, self.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def set_link(self, plane: int, up: bool) -> None:
        """Take plane ``plane``'s link down or up at both ends."""
        ia, ib = self.link_names(plane)
        state = "up" if up else "down"
        _ip("link", "set", ia, state, ns=self.a)
        _ip("link", "set", ib, state, ns=self.b)

    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        """argv that runs ``argv`` inside host ``a`` or ``b``."""
        ns = self.a if host == "a" else self.b
        return ["ip", "netns", "exec", ns, *argv]

    def __enter__(self) -> TwoHosts:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _tc_rate(ns: str, ifname: str, rate: str) -> None:
    cmd = [
        "tc",
        "-n",
        ns,
        "qdisc",
        "replace",
        "dev",
        ifname,
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        "256kb",
        "latency",
        "20ms",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise MRCError(f"{' '.join(cmd)}: {res.stderr.strip()}")


def leftover_namespaces(prefix: str) -> list[str]:
    """Namespaces whose name starts with ``prefix`` (to check that nothing leaked)."""
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [
        line.split()[0]
        for line in res.stdout.splitlines()
        if line.split() and line.split()[0].startswith(prefix)
    ]
