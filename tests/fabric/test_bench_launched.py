"""mrc-bench as a launched job across the hosts of a namespace fabric, as it runs on a cluster.

Each rank is one process inside its host's namespace; the launcher's way of starting it there
is ``mrc-fabric exec`` (an MPMD ``mpiexec`` line, or one process per host with torchrun's
variables), so nothing is shared between ranks but what a cluster shares: the launcher, and
the network. Checks the JSON against the schema, every step's SHA-256-verified bytes, the
launch facts, a plane failure mid-run done by the user's command on one rank, and that no
rank outlives the run.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fabric.fabric_helpers import SKIP_REASON, running_fabric, unique_name

from mrc.lab.fabric import FabricSpec, Topology

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("MRC_BIN_DIR") or Path(sys.executable).parent)
MPIEXEC = BIN / "mpiexec"
SCHEMA = json.loads((REPO / "docs/schemas/mrc-bench.schema.json").read_text())
HOSTS = 4
PER_STEP = {"alltoall": lambda size: HOSTS * (HOSTS - 1) * size, "pair": lambda size: size}


def _spec() -> FabricSpec:
    return FabricSpec(name=unique_name("L"), planes=2, hosts=HOSTS, rate="100mbit", mtu=9000)


def _rank_cmd(topo: Topology, host: int, *args: str) -> list[str]:
    """One rank: inside host ``host``'s namespace, as a launcher's remote shell would start it."""
    return [
        str(BIN / "mrc-fabric"),
        "exec",
        "--name",
        topo.name,
        f"h{host}",
        "--",
        *args,
    ]


def _leftover_ranks(marker: str) -> list[str]:
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "--launcher" in cmd and marker in cmd:
            found.append(f"{d.name}: {cmd}")
    return found


def _start_env_ranks(
    topo: Topology,
    port: int,
    bench_args: list[str],
    prefix: tuple[str, ...] = (),
    token: str | None = None,
) -> list[subprocess.Popen[str]]:
    """One rank per host with torchrun's variables, rank 0 at h0's last-plane address; with
    ``token``, the job's MRC_BENCH_TOKEN on every rank."""
    master = topo.hosts[0].nics[-1].address
    procs = []
    for h in range(HOSTS):
        env = {
            **os.environ,
            "RANK": str(h),
            "WORLD_SIZE": str(HOSTS),
            "MASTER_ADDR": master,
            "MASTER_PORT": str(port),
        }
        env.pop("MRC_BENCH_TOKEN", None)
        if token:
            env["MRC_BENCH_TOKEN"] = token
        bench = [str(BIN / "mrc-bench"), "--launcher", "env", "--fabric", topo.name]
        procs.append(
            subprocess.Popen(
                _rank_cmd(topo, h, *prefix, *bench, *bench_args),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    return procs


def _kill_all(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _check_rows(
    doc: dict[str, Any], conditions: set[str]
) -> dict[tuple[str, str, str], dict[str, Any]]:
    jsonschema.validate(doc, SCHEMA)
    cfg = doc["config"]
    rows = {(r["workload"], r["condition"], r["transport"]): r for r in doc["results"]}
    assert {c for _, c, _ in rows} == conditions
    for (workload, condition, transport), r in rows.items():
        what = f"{workload}/{condition}/{transport}"
        size = cfg["pair_size"] if workload == "pair" else cfg["size"]
        per_step = PER_STEP[workload](size)
        assert r["bytes_per_step"] == per_step, what
        assert r["bytes_expected"] == r["steps"] * per_step, what
        # every step either failed or moved exactly its bytes, hashes compared per transfer
        assert r["bytes_verified"] == (r["steps"] - r["failed_steps"]) * per_step, what
        assert r["sha256_ok"] is (r["failed_steps"] == 0), what
        if condition == "clean":
            assert r["failed_steps"] == 0 and r["steps"] == cfg["steps"], f"{what}: {r['errors']}"
    return rows


def _check_ranks(doc: dict[str, Any], topo: Topology, launcher: str) -> None:
    launch = doc["launch"]
    assert launch["launcher"] == launcher
    assert [r["rank"] for r in launch["ranks"]] == list(range(HOSTS))
    for r in launch["ranks"]:
        host = topo.hosts[r["rank"]]
        want = [n.address for n in sorted(host.nics, key=lambda n: n.plane)]
        assert r["addrs"] == want, "each rank found its own host's planes"
    assert launch["refused_hellos"] == 0
    # one machine, one CLOCK_MONOTONIC: the measured offsets are 0 within their error bound
    assert sorted(launch["clocks"]) == [str(r) for r in range(1, HOSTS)]
    for clock in launch["clocks"].values():
        assert abs(clock["offset_ms"]) <= clock["rtt_ms"] / 2 + 0.01, clock
    assert doc["config"]["hosts"] == HOSTS and doc["config"]["planes"] == 2


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec in the venv (pip install mpich)")
def test_mpiexec_runs_the_bench_across_fabric_hosts_and_a_plane_fails_mid_run() -> None:
    with running_fabric(_spec()) as topo:
        link = f"{BIN / 'mrc-fabric'} link --name {topo.name}"
        bench = [
            str(BIN / "mrc-bench"),
            "--launcher",
            "mpi",
            "--fabric",
            topo.name,
            "--quick",
            "--json",
            "--workloads",
            "alltoall",
            "--conditions",
            "clean,link_down",
            "--fault-rank",
            "1",
            "--fault-cmd",
            f"{link} down h1 p0l0",
            "--heal-cmd",
            f"{link} up h1 p0l0",
            "--rendezvous-timeout",
            "60",
        ]
        argv = [str(MPIEXEC)]
        for h in range(HOSTS):
            argv += ([":"] if h else []) + ["-n", "1", *_rank_cmd(topo, h, *bench)]
        t0 = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        took = time.monotonic() - t0
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "unauthenticated" not in proc.stderr  # MPI shares a job token
        doc = json.loads(proc.stdout)  # rank 0's one object; the other ranks print nothing
        rows = _check_rows(doc, {"clean", "link_down"})
        _check_ranks(doc, topo, "mpi")
        assert doc["launch"]["startup_s"] < took
        assert doc["launch"]["fault"] == {
            "rank": 1,
            "fault_cmd": f"{link} down h1 p0l0",
            "heal_cmd": f"{link} up h1 p0l0",
        }
        for transport in ("mrc", "tcp", "mptcp"):
            r = rows[("alltoall", "link_down", transport)]
            fault = r["fault"]
            # the plane really went away for the outage (--quick: 1 s) and came back
            assert fault["link"] == f"rank 1: {link} down h1 p0l0"
            assert fault["outage_ms"] >= 1000 * 0.9, fault
            assert r["steps"] > doc["config"]["steps"], "link_down runs on past the heal"
        # MRC takes the plane out and goes on: no step of its series fails
        mrc = rows[("alltoall", "link_down", "mrc")]
        assert mrc["failed_steps"] == 0, mrc["errors"]
        assert _leftover_ranks(topo.name) == []


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv (util-linux)")
def test_env_rendezvous_without_privileges_leaves_mptcp_out_and_verifies_the_rest() -> None:
    """torchrun's variables and a job token, one process per host started by hand; the ranks
    lack CAP_NET_ADMIN, as an ordinary user's would, so MPTCP is left out with the reason."""
    with running_fabric(_spec()) as topo:
        drop = ("setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin")
        args = ["--quick", "--json", "--workloads", "alltoall,pair"]
        procs = _start_env_ranks(topo, 29518, args, drop, token=secrets.token_hex(16))
        outs = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=240))
        finally:
            _kill_all(procs)
        for h, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
            assert p.returncode == 0, f"rank {h}: {err[-2000:]}"
            assert "unauthenticated" not in err, f"rank {h}: {err[-2000:]}"
            if h:
                assert out == "", f"rank {h} printed on stdout"
        doc = json.loads(outs[0][0])
        rows = _check_rows(doc, {"clean"})
        _check_ranks(doc, topo, "env")
        assert {t for _, _, t in rows} == {"mrc", "tcp"}
        assert doc["config"]["transports"] == ["mrc", "tcp"]
        (left,) = doc["launch"]["left_out"]
        assert left["transport"] == "mptcp" and "CAP_NET_ADMIN" in left["reason"]
        assert not any(r["net_admin"] for r in doc["launch"]["ranks"])
        assert _leftover_ranks(topo.name) == []


@pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
def test_a_rank_that_dies_ends_the_job_with_one_line_and_no_rank_left() -> None:
    """Rank 2 is killed while the steps run: rank 0 says which rank went away and exits 1;
    every other rank exits instead of waiting for a coordinator that has given up."""
    with running_fabric(_spec()) as topo:
        args = ["--workloads", "alltoall", "--transports", "mrc", "--steps", "1000"]
        procs = _start_env_ranks(topo, 29519, args + ["--size", "64K", "--pair-size", "64K"])
        try:
            # wait until rank 0 reports steps, then kill rank 2 (and what it started)
            assert procs[0].stderr is not None
            deadline = time.monotonic() + 120
            seen = ""
            while "step 3 " not in seen and time.monotonic() < deadline:
                line = procs[0].stderr.readline()
                if not line:
                    break
                seen += line
            assert "step 3 " in seen, seen[-2000:]
            # no MRC_BENCH_TOKEN: rank 0 said at start that anyone could take a rank's place
            assert "the control channel is unauthenticated" in seen, seen[-2000:]
            os.killpg(procs[2].pid, signal.SIGKILL)
            results = [p.communicate(timeout=120) for p in procs]
        finally:
            _kill_all(procs)
        rc0, err0 = procs[0].returncode, results[0][1].strip().splitlines()
        assert rc0 == 1, err0[-5:]
        assert err0[-1].startswith("mrc-bench: error: ") and "rank 2" in err0[-1], err0[-3:]
        assert "Traceback" not in results[0][1]
        for h in (1, 3):  # told to exit by rank 0, or left by it: gone either way
            assert procs[h].returncode is not None
            assert "Traceback" not in results[h][1], results[h][1][-2000:]
        assert _leftover_ranks(topo.name) == []
