"""The benchmark harness (mrc/lab/harness): reading children's output, stopping them whatever
they do, the machine object and the envelope every benchmark prints.

No root needed: the children are small Python programs on this machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import jsonschema
import pytest

import mrc
from mrc.errors import MRCError
from mrc.lab.fabric import FabricSpec, plan
from mrc.lab.harness.children import Children, exit_times, stop
from mrc.lab.harness.envelope import envelope
from mrc.lab.harness.fabric import port_deltas, status_counters
from mrc.lab.harness.hosts import in_host, tool_path, wait_listening
from mrc.lab.harness.machine import loadavg, machine_info, machine_line
from mrc.lab.harness.output import json_objects, last_json, last_line
from mrc.lab.harness.stats import jain, median, medians, rounded

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ---- output ---------------------------------------------------------------------------------


def test_last_json_skips_lines_that_do_not_parse() -> None:
    text = '{"a": 1}\nprogress 50%\n{"b": 2}\n{"cut short\n[1, 2]\n  \n'
    assert last_json(text) == {"b": 2}
    assert last_json("no json here\n{oops") is None
    assert last_json("") is None


def test_json_objects_are_every_result_in_order() -> None:
    text = '{"a": 1}\nprogress 50%\n {"b": 2}\n{"cut short\n[1, 2]\n{"c": 3}\n'
    assert json_objects(text) == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert json_objects("") == []


def test_last_line_is_the_last_that_says_something() -> None:
    assert last_line("first\nerror: why\n\n  \n") == "error: why"
    assert last_line("") == ""


def test_median_of_nothing_is_none() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([]) is None


def test_rounded_keeps_none() -> None:
    assert rounded(0.123456, 3) == 0.123
    assert rounded(None, 3) is None
    whole = rounded(1234.5678, None)  # to a whole number: an int, 1234 in the JSON, not 1234.0
    assert whole == 1235 and isinstance(whole, int)
    assert rounded(None, None) is None


def test_jain_is_one_for_an_even_split_and_one_nth_for_a_monopoly() -> None:
    assert jain([5.0, 5.0, 5.0]) == 1.0
    assert jain([1.0, 0.0, 0.0, 0.0]) == 0.25  # one stream got everything: 1/n
    assert jain([]) is None and jain([0.0, 0.0]) is None


def test_medians_leave_out_runs_without_the_figure() -> None:
    runs: list[dict[str, float | None]] = [{"a": 1.0, "b": None}, {"a": 2.0, "b": 0.123456}]
    runs.append({"a": 4.0})
    assert medians(runs, ("a", "b", "c")) == {"a": 2.0, "b": 0.123456, "c": None}
    assert medians(runs, ("b",), 2) == {"b": 0.12}
    assert list(medians(runs, ("b", "a"))) == ["b", "a"]  # in the order asked


# ---- children -------------------------------------------------------------------------------


def test_a_child_is_read_line_by_line_and_its_result_kept() -> None:
    code = "import json; print('ready', flush=True); print(json.dumps({'ok': True}))"
    with Children() as kids:
        child = kids.start(python(code), "talker")
        assert child.expect("ready", 10) == "ready"
        assert child.wait(10) == 0
    assert child.result() == {"ok": True}
    assert child.stdout.splitlines()[0] == "ready"


def test_expect_names_the_childs_last_words_when_it_exits_first() -> None:
    code = "import sys; sys.exit('cannot bind: address in use')"
    with Children() as kids, pytest.raises(MRCError, match="exited \\(1\\) before 'ready'"):
        kids.start(python(code), "receiver").expect("ready", 10)
    assert "cannot bind" in kids.started[0].err_tail(3)


def test_stop_ends_the_whole_group_on_the_way_out() -> None:
    """A child that forked a grandchild: leaving the block (here by an exception) ends both."""
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    with pytest.raises(RuntimeError), Children() as kids:
        child = kids.start(python(code), "parent")
        grandchild = int(child.expect("", 10))
        raise RuntimeError("the benchmark failed")
    assert child.returncode == -signal.SIGTERM
    for _ in range(100):  # the grandchild is not ours to reap: wait for it to go
        if gone(grandchild):
            break
        time.sleep(0.05)
    assert gone(grandchild)


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    with Children() as kids:
        child = kids.start(python(code), "stubborn")
        child.expect("ready", 10)
        t0 = time.monotonic()
        stop([child], grace=0.3)
        assert time.monotonic() - t0 < 5
    assert child.returncode == -signal.SIGKILL and child.stopped


def test_wait_stops_a_child_that_overruns() -> None:
    with Children() as kids:
        child = kids.start(python("import time; time.sleep(60)"), "sleeper")
        with pytest.raises(MRCError, match="sleeper did not finish in 0.2 s"):
            child.wait(0.2)
        assert not child.running and child.stopped


def test_exit_times_say_when_each_child_ended() -> None:
    with Children() as kids:
        quick = kids.start(python("print('{\"n\": 1}'); print('{\"n\": 2}')"), "quick")
        slow = kids.start(python("import time; time.sleep(0.5)"), "slow")
        t0 = time.monotonic()
        exits = exit_times({"quick": quick, "slow": slow}, 10)
        assert set(exits) == {"quick", "slow"} and t0 <= exits["quick"] < exits["slow"]
        assert exits["slow"] - t0 >= 0.5
        assert quick.results() == [{"n": 1}, {"n": 2}]  # everything it printed read
        stuck = kids.start(python("import time; time.sleep(60)"), "stuck")
        assert exit_times({"stuck": stuck, "quick": quick}, 0.2).keys() == {"quick"}
        assert stuck.running  # left to its caller (and to the end of the block)
    assert not stuck.running


# ---- hosts ----------------------------------------------------------------------------------


def test_wait_listening_sees_a_tcp_listener() -> None:
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    code = (
        "import socket, time\n"
        f"s = socket.socket(socket.AF_INET6); s.bind(('::1', {port})); s.listen()\n"
        "time.sleep(60)\n"
    )
    with Children() as kids:
        child = kids.start(python(code), "listener")
        wait_listening(child, port, None, 10)
        assert child.running
        quiet = kids.start(python("import time; time.sleep(60)"), "quiet")
        with pytest.raises(MRCError, match="quiet did not listen on port"):
            wait_listening(quiet, port + 1 if port < 65535 else port - 1, None, 0.2)


def test_in_host_runs_in_the_namespace_or_the_container() -> None:
    topo = plan(FabricSpec(name="hx", planes=1))
    assert in_host(topo, "h0", ["true"]) == ["ip", "netns", "exec", topo.netns_of("h0"), "true"]
    h0 = dataclasses.replace(topo.hosts[0], container="mrc-hx-h0")
    boxed = dataclasses.replace(topo, hosts=(h0, *topo.hosts[1:]), engine="podman")
    assert in_host(boxed, "h0", ["true"]) == [
        "podman",
        "exec",
        "--interactive",
        "mrc-hx-h0",
        "true",
    ]


def test_tool_path_prefers_this_pythons_commands() -> None:
    assert Path(tool_path("mrc-send")).name == "mrc-send"
    with pytest.raises(MRCError, match="no-such-tool not found"):
        tool_path("no-such-tool")


# ---- machine and envelope -------------------------------------------------------------------


def test_machine_info_is_what_the_schemas_describe() -> None:
    """mrc-bench's, bench_qp's, bench_fabric's, the failover demo's and the trim benchmark's
    machine objects are this one (bench_qp adds its memory figures)."""
    machine = machine_info(loadavg())
    assert machine["mrc_version"] == mrc.__version__ and machine["cpus"] == os.cpu_count()
    for tool in ("mrc-bench", "bench_fabric", "failover_demo", "trim_bench"):
        schema = json.loads((SCHEMAS / f"{tool}.schema.json").read_text())
        sub = {**schema["properties"]["machine"], "$defs": schema.get("$defs", {})}
        jsonschema.validate(machine, sub)


def test_machine_line_is_the_foot_of_a_table() -> None:
    machine = {"cpus": 2, "loadavg_start": [1.5, 1, 1], "loadavg_end": [2.25, 1, 1]}
    assert machine_line(machine, 12.3) == "machine: 2 cpus, load 1.5 -> 2.25; 12.3 s in all"


def test_status_counters_are_each_present_ends_drops_and_trims() -> None:
    """What :func:`port_counters` reads from a fabric's status: a router end (with ``trim``),
    a host end (without) and an end whose namespace is gone (left out)."""
    end = {"present": True, "qdisc_drops": 5, "rx_dropped": 1, "tx_dropped": 2}
    trim = {"trimmed": 9, "tail_drops": 4, "lasthop": True, "threshold": 7}
    status = {
        "links": [
            {
                "a": "p0l1",
                "b": "h3",
                "a_end": {**end, "ifname": "h3", "trim": trim},
                "b_end": {**end, "ifname": "l1", "qdisc_drops": 0},
            },
            {"a": "p0s0", "b": "p0l1", "a_end": {"ifname": "l1", "present": False}, "b_end": {}},
        ]
    }
    assert status_counters(status) == {
        "p0l1:h3": {
            "drops": 8,
            "tbf_drops": 5,
            "interface_drops": 3,
            "trimmed": 9,
            "tail_drops": 4,
            "lasthop": True,
        },
        "h3:l1": {
            "drops": 3,
            "tbf_drops": 0,
            "interface_drops": 3,
            "trimmed": 0,
            "tail_drops": 0,
            "lasthop": False,
        },
    }


def test_port_deltas_are_what_the_fabric_did_meanwhile() -> None:
    before = {"p0l1:h1": {"drops": 1, "trimmed": 2, "lasthop": True}}
    after = {
        "p0l1:h1": {"drops": 4, "trimmed": 9, "lasthop": True},
        "p0s0:l0": {"drops": 0, "trimmed": 5, "lasthop": False},  # not read before: from 0
    }
    assert port_deltas(before, after) == {
        "fabric_trims": 12,
        "fabric_trims_lasthop": 7,
        "fabric_drops": 3,
        "drops_at": {"p0l1:h1": 3},
    }


def test_the_envelope_opens_every_object_alike() -> None:
    out = envelope("bench_x", {"cpus": 2}, {"config": {"runs": 1}, "results": []})
    assert list(out) == ["tool", "machine", "config", "results"]
    with pytest.raises(ValueError, match="tool"):
        envelope("bench_x", {}, {"tool": "other"})
