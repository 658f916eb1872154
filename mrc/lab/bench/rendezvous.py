"""How a launched ``mrc-bench`` rank learns who it is and where rank 0 listens.

A launcher (``mpiexec``, ``srun``, ``torchrun`` or anything that sets the same variables)
starts one process per host. Each needs its rank, the number of ranks, and rank 0's control
address. Three ways in, as the usual launchers provide them:

* ``mpi``: mpi4py's ``COMM_WORLD`` gives rank and size; rank 0 opens its control listener on
  a free port and broadcasts its addresses and a random job token. MPI carries nothing else:
  no data, no step barriers (those go over the control connections).
* ``env``: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, as torchrun sets them
  (and as a user can set them by hand). Rank 0 listens on ``MASTER_PORT``.
* ``slurm``: ``SLURM_PROCID`` and ``SLURM_NTASKS`` from ``srun``; ``MASTER_ADDR`` as for
  ``env`` or else the job's first node (``scontrol show hostnames``); ``MASTER_PORT`` or the
  default.

``auto`` picks from the environment: MPI launchers' variables (when mpi4py is installed, or
there is no Slurm to fall back on), then Slurm's, then ``RANK``.

The job token (MPI's random one, or ``MRC_BENCH_TOKEN`` for env and slurm) never crosses the
control connection: each side proves it holds it with :func:`proof`, an HMAC-SHA256 over
both sides' fresh nonces (mrc/lab/bench/launched.py). Rank 0 listens where ``MASTER_ADDR``
says (:func:`listen_addrs`): an IPv4 address gets an IPv4 socket.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mrc.errors import UsageError

LAUNCHERS = ("auto", "mpi", "env", "slurm")
DEFAULT_PORT = 29517  # the control port of env/slurm rendezvous when MASTER_PORT is unset

# what MPI launchers put in each rank's environment (MPICH/Hydra, Open MPI, Intel MPI, PMIx)
_MPI_MARKERS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_LOCALRANKID")


@dataclass
class Rendezvous:
    """This rank's place in the job, and how to reach rank 0's control listener."""

    launcher: str
    rank: int
    world: int
    #: where rank 0 listens: (host, port) candidates, tried in order; empty on rank 0 until
    #: :meth:`publish` (MPI learns them from rank 0, env/slurm know them up front)
    coordinator: list[tuple[str, int]] = field(default_factory=list)
    #: the port rank 0 should listen on (0: any free port; MPI tells the others which)
    listen_port: int = 0
    #: a shared secret every rank shows in its hello; "" where the launcher cannot share one
    token: str = ""
    _publish: Callable[[list[tuple[str, int]], str], tuple[list[tuple[str, int]], str]] | None = (
        None
    )

    def publish(self, addrs: list[tuple[str, int]], token: str) -> None:
        """Rank 0: tell every rank where it listens (MPI's broadcast); other ranks: learn it.
        Collective under MPI: every rank must call it, rank 0 with its addresses."""
        if self._publish is not None:
            self.coordinator, self.token = self._publish(addrs, token)
        elif self.rank == 0:
            self.token = token


def _int_var(env: Mapping[str, str], name: str) -> int:
    text = env.get(name, "")
    try:
        v = int(text)
    except ValueError:
        raise UsageError(f"{name}={text!r} is not a number") from None
    if v < 0:
        raise UsageError(f"{name}={text} is negative")
    return v


def _check(rank: int, world: int, how: str) -> None:
    if world < 2:
        raise UsageError(f"{how}: a launched run needs at least 2 ranks, not {world}")
    if rank >= world:
        raise UsageError(f"{how}: rank {rank} is not below the world size {world}")


def _master(env: Mapping[str, str], fallback: Callable[[], str | None]) -> tuple[str, int]:
    addr = env.get("MASTER_ADDR") or fallback()
    if not addr:
        raise UsageError("MASTER_ADDR is not set: the address where rank 0 listens")
    port = _int_var(env, "MASTER_PORT") if env.get("MASTER_PORT") else DEFAULT_PORT
    if not 1 <= port <= 65535:
        raise UsageError(f"MASTER_PORT={port} is not a port")
    return addr.strip("[]"), port


def from_env(env: Mapping[str, str]) -> Rendezvous:
    """torchrun's variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT."""
    for name in ("RANK", "WORLD_SIZE"):
        if name not in env:
            raise UsageError(
                f"--launcher env: {name} is not set (torchrun sets RANK, WORLD_SIZE,"
                " MASTER_ADDR and MASTER_PORT)"
            )
    rank, world = _int_var(env, "RANK"), _int_var(env, "WORLD_SIZE")
    _check(rank, world, "--launcher env")
    host, port = _master(env, lambda: None)
    return Rendezvous(
        "env", rank, world, [(host, port)], listen_port=port, token=env.get("MRC_BENCH_TOKEN", "")
    )


def _first_slurm_node(env: Mapping[str, str]) -> str | None:
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    scontrol = shutil.which("scontrol")
    if not nodes or scontrol is None:
        return None
    try:
        out = subprocess.run(
            [scontrol, "show", "hostnames", nodes], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    names = out.stdout.split()
    return names[0] if out.returncode == 0 and names else None


def from_slurm(env: Mapping[str, str]) -> Rendezvous:
    """srun's SLURM_PROCID and SLURM_NTASKS; MASTER_ADDR, or the job's first node."""
    for name in ("SLURM_PROCID", "SLURM_NTASKS"):
        if name not in env:
            raise UsageError(f"--launcher slurm: {name} is not set (start the ranks with srun)")
    rank, world = _int_var(env, "SLURM_PROCID"), _int_var(env, "SLURM_NTASKS")
    _check(rank, world, "--launcher slurm")
    host, port = _master(env, lambda: _first_slurm_node(env))
    return Rendezvous(
        "slurm",
        rank,
        world,
        [(host, port)],
        listen_port=port,
        token=env.get("MRC_BENCH_TOKEN", ""),
    )


def from_mpi() -> Rendezvous:
    """mpi4py's COMM_WORLD; rank 0's control addresses and a job token are broadcast."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise UsageError(
            "--launcher mpi needs mpi4py and an MPI (pip install mpi4py mpich, or Open MPI from"
            " apt); or use --launcher env"
        ) from None
    comm = MPI.COMM_WORLD
    rank, world = int(comm.Get_rank()), int(comm.Get_size())
    _check(rank, world, "--launcher mpi")

    def publish(addrs: list[tuple[str, int]], token: str) -> tuple[list[tuple[str, int]], str]:
        got = comm.bcast((addrs, token) if rank == 0 else None, root=0)
        return [(str(h), int(p)) for h, p in got[0]], str(got[1])

    return Rendezvous("mpi", rank, world, listen_port=0, _publish=publish)


def detect(env: Mapping[str, str]) -> str:
    """The launcher ``auto`` stands for in this environment."""
    import importlib.util

    mpi = any(k in env for k in _MPI_MARKERS)
    if mpi and (importlib.util.find_spec("mpi4py") is not None or "SLURM_PROCID" not in env):
        return "mpi"
    if "SLURM_PROCID" in env:
        return "slurm"
    if "RANK" in env:
        return "env"
    raise UsageError(
        "--launcher auto: no launcher found (none of PMI_RANK, OMPI_COMM_WORLD_RANK,"
        " SLURM_PROCID, RANK is set); start the ranks with mpiexec, srun or torchrun"
    )


def rendezvous(launcher: str, env: Mapping[str, str] | None = None) -> Rendezvous:
    """This process's :class:`Rendezvous` for ``launcher`` (one of :data:`LAUNCHERS`)."""
    env = os.environ if env is None else env
    if launcher == "auto":
        launcher = detect(env)
    if launcher == "mpi":
        return from_mpi()
    if launcher == "slurm":
        return from_slurm(env)
    if launcher == "env":
        return from_env(env)
    raise UsageError(f"unknown launcher {launcher!r}: choose from {', '.join(LAUNCHERS)}")


def new_token() -> str:
    return secrets.token_hex(16)


def new_nonce() -> str:
    """A challenge: 128 random bits, never used twice."""
    return secrets.token_hex(16)


#: who computes a proof; the labels differ, so a proof rank 0 gives can never pass as a rank's
RANK0, RANK = "mrc-bench rank0", "mrc-bench rank"


def proof(token: str, who: str, first: str, second: str, rank: int) -> str:
    """HMAC-SHA256 with the job token over ``who | first | second | rank``: rank 0 proves the
    token with ``(RANK0, the rank's nonce, its own, rank)``, a rank with ``(RANK, rank 0's
    nonce, its own, rank)``. Each side's fresh nonce makes a recorded proof useless, and the
    token itself is never sent. "" without a token."""
    if not token:
        return ""
    msg = f"{who}|{first}|{second}|{rank}".encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()


def proves(token: str, got: object, who: str, first: str, second: str, rank: int) -> bool:
    """Whether ``got`` is the :func:`proof` (in constant time); always False without a token."""
    if not token or not isinstance(got, str):
        return False
    return hmac.compare_digest(got.encode(), proof(token, who, first, second, rank).encode())


WILDCARD = {int(socket.AF_INET): "0.0.0.0", int(socket.AF_INET6): "::"}


def listen_addrs(names: list[str]) -> list[tuple[int, str, bool]]:
    """Where rank 0 binds so that ``names`` (MASTER_ADDR, or the addresses MPI announces)
    reach it: (family, address, exact) per socket. An address literal is bound as it is
    (``exact``: the caller falls back to its family's wildcard if it is not local); a host
    name is resolved for its families only and gets their wildcards, because on the host
    itself a name may resolve to a loopback address (Debian's 127.0.1.1) that no other host
    can reach."""
    out: list[tuple[int, str, bool]] = []
    for name in names:
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            try:
                infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
                families = sorted({int(i[0]) for i in infos if i[0] in WILDCARD})
            except (OSError, UnicodeError):
                families = []
            for fam in families or list(WILDCARD):
                out.append((fam, WILDCARD[fam], False))
            continue
        fam = int(socket.AF_INET6 if ip.version == 6 else socket.AF_INET)
        out.append((fam, name, not ip.is_unspecified))
    wild = {fam for fam, addr, exact in out if not exact}
    seen: list[tuple[int, str, bool]] = []
    for fam, addr, exact in out:
        if exact and fam in wild:
            continue  # the family's wildcard covers it (and both cannot be bound)
        if (fam, addr) not in [(f, a) for f, a, _ in seen]:
            seen.append((fam, addr, exact))
    return seen
