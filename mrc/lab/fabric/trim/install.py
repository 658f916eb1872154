"""Put the trimming program on a fabric's routers, read its counters, take it away.

Per router: load one instance of the object (own maps), pin program and maps under
``/sys/fs/bpf/mrc-<fabric>/<router>/{prog,egress,rstats}``, write one ``egress`` entry per port
(rate, virtual queue limit, last-hop flag; keyed by the port's ifindex), and attach the program
to the *ingress* of every port (clsact, direct action).  Per host NIC: turn off transmit
checksum offload and UDP segmentation offload (see :func:`host_offloads_off`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mrc.errors import FabricError
from mrc.topology.model import Topology

from .. import netns
from ..kernel import NsHandle, handles
from . import build, libbpf
from .maps import (
    BPFFS,
    EGRESS,
    KEY,
    PIN_EGRESS,
    PIN_PROG,
    PIN_RSTATS,
    PROG_NAME,
    RSTATS,
    RSTATS_FIELDS,
    fabric_pin_dir,
    port_config,
    router_pin_dir,
    unpack_egress,
)

TC_H_CLSACT_INGRESS = "ffff:fff2"

#: Host NIC features turned off under --trim (those the NIC has).
HOST_FEATURES_OFF = ("tx-checksum-ip-generic", "tx-checksum-ipv6", "tx-udp-segmentation")


def bpffs_mounted() -> bool:
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) > 4 and fields[4] == BPFFS and right.split()[:1] == ["bpf"]:
                    return True
    except OSError:
        pass
    return False


def ensure_bpffs() -> None:
    """Mount bpffs on /sys/fs/bpf if nothing is mounted there (as systemd normally does)."""
    if bpffs_mounted():
        return
    try:
        os.makedirs(BPFFS, exist_ok=True)
    except OSError as e:
        raise FabricError(f"--trim: cannot create {BPFFS}: {e.strerror}") from None
    if netns._mount("bpf", BPFFS, "bpf", 0) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise FabricError(f"--trim: cannot mount bpffs on {BPFFS}: {os.strerror(err)}")


def unavailable_reason() -> str | None:
    """Why ``up --trim`` cannot work on this machine (one line), or None."""
    if os.geteuid() != 0:
        return "needs root (BPF programs, bpffs, tc)"
    if not build.object_path().exists():
        why = build.missing()
        if why:
            return why
    why = libbpf.available()
    if why:
        return why
    if not bpffs_mounted() and not os.path.isdir(os.path.dirname(BPFFS)):
        return f"no {os.path.dirname(BPFFS)} to mount bpffs on"
    return None


def prepare() -> Path:
    """Everything that can fail before a fabric is built: tools, compile, bpffs."""
    why = unavailable_reason()
    if why:
        raise FabricError(f"--trim: {why}")
    obj = build.compile_object()
    ensure_bpffs()
    return obj


def _router_ports(topo: Topology, router: str) -> list[tuple[str, bool, int | None]]:
    """(ifname, lasthop, rate_bps) of each port of ``router``."""
    ports = []
    for lk in topo.links_of(router):
        ifname, _ = lk.end(router)
        lasthop = lk.kind == "host-leaf" and lk.b == router
        ports.append((ifname, lasthop, lk.rate_bps))
    return ports


def install(topo: Topology, obj: Path) -> None:
    """Load, pin, configure and attach the program on every router; host offloads off."""
    ensure_bpffs()
    top = fabric_pin_dir(topo.name)
    os.makedirs(top, exist_ok=True)
    with handles(r.netns for r in topo.routers) as hs:
        for r in topo.routers:
            _install_router(topo, r.name, hs[r.netns], obj)
    for h in topo.hosts:
        for nic in h.nics:
            host_offloads_off(h.netns, nic.nic)


def _install_router(topo: Topology, router: str, h: NsHandle, obj: Path) -> None:
    d = router_pin_dir(topo.name, router)
    os.makedirs(d, exist_ok=True)
    with libbpf.BpfObject(str(obj)) as o:
        prog_fd = o.program_fd(PROG_NAME)
        eg_fd = o.map_fd(PIN_EGRESS)
        rs_fd = o.map_fd(PIN_RSTATS)
        _ks, vs, _n = libbpf.map_info(eg_fd)
        if vs != EGRESS.size:
            raise FabricError(
                f"BPF map 'egress' value is {vs} bytes, maps.py expects {EGRESS.size}:"
                " mrc_trim.bpf.c and mrc/lab/fabric/trim/maps.py disagree"
            )
        libbpf.pin(prog_fd, os.path.join(d, PIN_PROG))
        libbpf.pin(eg_fd, os.path.join(d, PIN_EGRESS))
        libbpf.pin(rs_fd, os.path.join(d, PIN_RSTATS))
        ports = _router_ports(topo, router)
        for ifname, lasthop, rate_bps in ports:
            if not rate_bps:
                continue
            cfg = port_config(
                rate_bps, topo.mtu, lasthop, ecn_fraction=topo.ecn_threshold, prio=topo.prio_band
            )
            libbpf.map_update(eg_fd, KEY.pack(h.index(ifname)), cfg.pack())
        for ifname, _lasthop, _rate in ports:
            idx = h.index(ifname)
            h.ipr.tc("add", "clsact", idx)
            h.ipr.tc(
                "add-filter",
                "bpf",
                idx,
                ":1",
                fd=prog_fd,
                name=PROG_NAME,
                parent=TC_H_CLSACT_INGRESS,
                classid=1,
                direct_action=True,
            )


def host_offloads_off(ns: str, ifname: str) -> None:
    """Turn off transmit checksum and UDP segmentation offload on a host NIC.

    * UDP segmentation (USO): a GSO super-packet crossing the veth whole would reach the router
      as one 64 KB skb; the program never trims GSO skbs (it charges them whole), so without
      this a UDP_SEGMENT sender's packets would be tail-dropped instead of trimmed.  With USO
      off the kernel segments in software before the veth; senders using UDP_SEGMENT keep
      working unchanged.
    * Checksum offload: with it on, a packet leaves the host CHECKSUM_PARTIAL (the UDP checksum
      field holds only the pseudo-header sum) and the receiving veth accepts it unverified.
      With it off every packet carries a real checksum and the receiver verifies it, so a
      trimmed packet that reaches a socket has provably been re-checksummed correctly.
    """
    from pyroute2.ethtool.ioctl import IoctlEthtool

    with netns.entered(ns):
        et = IoctlEthtool()
    try:
        et.change_ifname(ifname)
        feats = et.get_features()
        changed = False
        for name in HOST_FEATURES_OFF:
            if name in feats and feats.is_active(name):
                feats.set_value(name, False)
                changed = True
        if changed:
            et.set_features(feats)
        feats = et.get_features()
        still = [n for n in HOST_FEATURES_OFF if n in feats and feats.is_active(n)]
        if still:
            raise FabricError(f"--trim: cannot turn off {', '.join(still)} on {ns}:{ifname}")
    finally:
        et.close()


# --- reading counters ---------------------------------------------------------------------


def read_router(fabric: str, router: str) -> dict[str, Any] | None:
    """{"ports": {ifindex: {...}}, "router": {...}} from a router's pinned maps, or None when
    the router has no pins (no --trim, or already down)."""
    d = router_pin_dir(fabric, router)
    if not os.path.exists(os.path.join(d, PIN_EGRESS)):
        return None
    ports: dict[int, dict[str, Any]] = {}
    fd = libbpf.open_pinned(os.path.join(d, PIN_EGRESS))
    try:
        for key in libbpf.map_keys(fd, KEY.size):
            raw = libbpf.map_lookup(fd, key, EGRESS.size, libbpf.BPF_F_LOCK)
            if raw is not None:
                ports[KEY.unpack(key)[0]] = unpack_egress(raw)
    finally:
        os.close(fd)
    totals = dict.fromkeys(RSTATS_FIELDS, 0)
    path = os.path.join(d, PIN_RSTATS)
    if os.path.exists(path):
        fd = libbpf.open_pinned(path)
        try:
            ncpu = libbpf.possible_cpus()
            slot = (RSTATS.size + 7) // 8 * 8
            raw = libbpf.map_lookup(fd, KEY.pack(0), slot * ncpu)
            if raw is not None:
                for c in range(ncpu):
                    for f, v in zip(RSTATS_FIELDS, RSTATS.unpack_from(raw, c * slot), strict=True):
                        totals[f] += v
        finally:
            os.close(fd)
    path = os.path.join(d, PIN_PROG)
    if os.path.exists(path):
        fd = libbpf.open_pinned(path)
        try:
            totals["run_time_ns"], totals["runs"] = libbpf.prog_run_stats(fd)
        finally:
            os.close(fd)
    return {"ports": ports, "router": totals}
