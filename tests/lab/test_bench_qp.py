"""tools/bench_qp.py without running it: its arguments, the summary of its runs per --security
mode and per --checksum (mrc.lab.bench.qp), and the table it prints (mrc.lab.bench.qp_report).

The real runs need root and namespaces (tests/cli/test_json_schemas.py runs one --quick); here
the runs are made up, so every figure the summary and the table show is known.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest

from mrc.lab.bench import qp
from mrc.lab.bench.qp_report import checksum_table, table

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "bench_qp.py"
SCHEMA = json.loads((REPO / "docs" / "schemas" / "bench_qp.schema.json").read_text())
GIB = 1 << 30


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_qp_tool", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _args(*argv: str) -> argparse.Namespace:
    tool = _tool()
    p = tool.build_parser()
    a: argparse.Namespace = p.parse_args(list(argv))
    tool._finish_args(p, a)
    return a


def _run(
    gbps: float, send_cpu: float | None, recv_cpu: float | None, checksum: str, **kw: Any
) -> dict[str, Any]:
    """One MRC run as Bench.mrc_run records it."""
    seconds = GIB * 8 / (gbps * 1e9)
    return {
        "ok": True,
        "security": "none",
        "checksum": checksum,
        "bytes": GIB,
        "seconds": seconds,
        "goodput_bps": round(gbps * 1e9),
        "packets_sent": 131072,
        "data_packets": 131072,
        "pps": 131072 / seconds,
        "retransmits": 0,
        "send_cpu_s_per_gib": send_cpu,
        "recv_cpu_s_per_gib": recv_cpu,
        "retransmits_nack": 0,
        "retransmits_timeout": 0,
        "nacks": 0,
        "srtt_ms": 0.4,
        "planes": 1,
        "dropped_by_reason": {},
        "wall_seconds": seconds + 0.5,
        **kw,
    }


def _tcp(gbps: float, send_cpu: float | None = 0.5, recv_cpu: float | None = 0.6) -> dict[str, Any]:
    """One kernel TCP run as Bench.peer_run records it."""
    return {
        "bps": gbps * 1e9,
        "payload_bps": gbps * 1e9,
        "pps": None,
        "seconds": 2.0,
        "bytes": round(gbps * 1e9 / 8 * 2.0),
        "send_bytes": round(gbps * 1e9 / 8 * 2.5),
        "send_cpu_s_per_gib": send_cpu,
        "recv_cpu_s_per_gib": recv_cpu,
    }


#: three TCP runs: medians 15.5 Gbit/s, CPU 0.5 s/GiB sending and 0.6 receiving
TCP_RUNS = [_tcp(15.0, 0.5, 0.6), _tcp(16.0, 0.4, 0.7), _tcp(15.5, 0.6, 0.5)]


#: three runs per checksum: blake3 first (the base), xxh3-128 cheaper, sha256 dearer
RUNS = {
    "blake3": [_run(3.0, 2.0, 1.9, "blake3"), _run(3.2, 2.1, 2.0, "blake3", retransmits=4)]
    + [_run(3.1, 2.2, 2.1, "blake3")],
    "xxh3-128": [_run(3.3, 1.8, 1.7, "xxh3-128"), _run(3.4, 1.85, 1.75, "xxh3-128")]
    + [_run(3.5, 1.9, 1.8, "xxh3-128")],
    "sha256": [_run(2.6, 2.6, 2.5, "sha256"), _run(2.8, 2.5, 2.4, "sha256")],
}
SHA_ERROR = "mrc-send failed: x (mrc-recv: y)"


def _results(
    a: argparse.Namespace, tcp: list[dict[str, Any]] | None = None
) -> dict[str, list[Any]]:
    """The results of one (links, payload) as Bench.topology collects them for ``a``, the TCP
    runs ``tcp`` (default TCP_RUNS)."""
    r: dict[str, list[Any]] = {}
    for kind, (_mode, check) in qp._configs(a).items():
        r[kind] = list(RUNS[check or "blake3"])
        r[f"{kind}_errors"] = [SHA_ERROR] if check == "sha256" else []
    r["tcp"], r["tcp_errors"] = [dict(x) for x in (TCP_RUNS if tcp is None else tcp)], []
    for kind in ("raw", "gso"):  # no made-up UDP runs: theirs failed
        r[kind], r[f"{kind}_errors"] = [], [f"{kind} receiver failed: no datagram"]
    return r


def _out(a: argparse.Namespace, tcp: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What bench_qp would print for ``a`` had its runs gone as RUNS (and ``tcp``) say."""
    row = qp.Bench(a, lambda _: None)._summarise(1, 8192, _results(a, tcp))
    machine = {
        "hostname": "h",
        "kernel": "6.1",
        "cpus": 2,
        "cpu_model": "",
        "python": "3.11.2",
        "event_loop": "uvloop",
        "mrc_version": "0",
        "mrc_commit": None,
        "loadavg_start": [0.1, 0.2, 0.3],
        "loadavg_end": [0.1, 0.2, 0.3],
        "date": "2026-11-28T22:00:00+0000",
        "first_touch_us_per_page_start": 0.5,
        "first_touch_us_per_page_end": 0.5,
    }
    config = {
        "size": GIB,
        "payloads": a.payloads,
        "links": a.links,
        "runs": 3,
        "duration": a.duration,
        "mtu": a.mtu,
        "evs": "mrc-send default (128)",
        "qp": a.qp,
        "window": "mrc-send default (512)",
        "raw_datagram": "payload + 28 bytes",
        "quick": False,
        "aim_bps": qp.AIM_BPS,
        "security": a.security,
        "checksum": a.checksum,
        "compare": a.compare,
    }
    out: dict[str, Any] = {"tool": "bench_qp", "version": "0", "machine": machine, "config": config}
    out |= {"results": [row], "elapsed_seconds": 9.0}
    jsonschema.validate(out, SCHEMA)
    return out


# ---- arguments ---------------------------------------------------------------------------


def test_checksum_defaults_to_none_asked_for_and_one_configuration() -> None:
    a = _args("--compare", "tcp")
    assert a.checksum is None
    # as before --checksum: one MRC configuration, under the results key it always had
    assert qp._configs(a) == {"mrc": ("none", None)}
    sec = _args("--security", "none,integrity")
    assert qp._configs(sec) == {"mrc": ("none", None), "mrc_integrity": ("integrity", None)}


def test_checksum_list_is_a_configuration_each_in_its_order() -> None:
    a = _args("--checksum", "xxh3-128, sha256,xxh3-128,blake3")
    assert a.checksum == ["xxh3-128", "sha256", "blake3"]  # once each, in order
    assert list(qp._configs(a).values()) == [
        ("none", "xxh3-128"),
        ("none", "sha256"),
        ("none", "blake3"),
    ]
    # one checksum with several modes: each mode's runs all get it
    keyed = _args("--security", "none,encrypt", "--checksum", "sha256")
    assert list(qp._configs(keyed).values()) == [("none", "sha256"), ("encrypt", "sha256")]


@pytest.mark.parametrize(
    "argv",
    [
        ["--checksum", "md5"],
        ["--checksum", ","],
        ["--security", "none,integrity", "--checksum", "blake3,sha256"],
    ],
)
def test_bad_checksum_lists_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _args(*argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # one line
    assert "checksum" in err


# ---- the summary -------------------------------------------------------------------------


def test_checksum_summary_medians_cpu_per_side_and_cost_against_the_first() -> None:
    errors = {"blake3": [], "xxh3-128": [], "sha256": [SHA_ERROR]}
    got = qp.checksum_summary(RUNS, errors)
    assert list(got) == ["blake3", "xxh3-128", "sha256"]
    b, x, s = got["blake3"], got["xxh3-128"], got["sha256"]
    assert b["goodput_bps_median"] == 3.1e9 and x["goodput_bps_median"] == 3.4e9
    assert s["goodput_bps_median"] == 2.7e9  # the median of two runs
    assert (b["send_cpu_s_per_gib_median"], b["recv_cpu_s_per_gib_median"]) == (2.1, 2.0)
    assert (x["send_cpu_s_per_gib_median"], x["recv_cpu_s_per_gib_median"]) == (1.85, 1.75)
    assert (s["send_cpu_s_per_gib_median"], s["recv_cpu_s_per_gib_median"]) == (2.55, 2.45)
    assert b["cost_vs_first"] == 0.0
    assert x["cost_vs_first"] == round(1 - 3.4 / 3.1, 3) == -0.097  # faster: a negative cost
    assert s["cost_vs_first"] == round(1 - 2.7 / 3.1, 3) == 0.129
    assert (b["send_cpu_s_per_gib_vs_first"], b["recv_cpu_s_per_gib_vs_first"]) == (0.0, 0.0)
    assert (x["send_cpu_s_per_gib_vs_first"], x["recv_cpu_s_per_gib_vs_first"]) == (-0.25, -0.25)
    assert (s["send_cpu_s_per_gib_vs_first"], s["recv_cpu_s_per_gib_vs_first"]) == (0.45, 0.45)
    assert b["retransmits"] == [0, 4, 0] and x["goodput_bps"] == [3_300_000_000, 3.4e9, 3.5e9]
    assert b["all_ok"] and x["all_ok"] and not s["all_ok"]
    assert s["errors"] == [SHA_ERROR]
    # the first checksum's runs are mrc's own (mrc.runs); every other's are here
    assert "runs" not in b and x["runs"] == RUNS["xxh3-128"] and len(s["runs"]) == 2


def test_checksum_summary_without_cpu_or_runs_says_null() -> None:
    got = qp.checksum_summary(
        {"blake3": [_run(3.0, None, 2.0, "blake3")], "sha256": []},
        {"blake3": [], "sha256": ["timed out"]},
    )
    assert got["blake3"]["send_cpu_s_per_gib_median"] is None
    assert got["blake3"]["recv_cpu_s_per_gib_vs_first"] == 0.0
    sha = got["sha256"]
    assert sha["goodput_bps_median"] is None and sha["cost_vs_first"] is None
    assert sha["send_cpu_s_per_gib_vs_first"] is None and sha["recv_cpu_s_per_gib_vs_first"] is None
    assert not sha["all_ok"] and sha["runs"] == []


def test_a_row_with_checksums_reports_each_and_mrc_is_the_first() -> None:
    out = _out(_args("--checksum", "blake3,xxh3-128,sha256", "--compare", "tcp"))
    (row,) = out["results"]
    assert row["mrc"]["checksum"] == "blake3"
    assert row["mrc"]["runs"] == RUNS["blake3"]
    assert row["mrc"]["send_cpu_s_per_gib_median"] == 2.1
    assert row["mrc_vs_tcp"] == round(3.1 / 15.5, 3)
    assert list(row["checksum"]) == ["blake3", "xxh3-128", "sha256"]
    assert row["checksum"]["sha256"]["cost_vs_first"] == 0.129
    assert list(row["security"]) == ["none"]  # its runs: the first checksum's
    assert row["security"]["none"]["goodput_bps_median"] == 3.1e9


def test_a_row_without_checksum_has_no_checksum_entries_but_names_the_one_used() -> None:
    out = _out(_args("--security", "none,integrity", "--compare", "tcp"))
    (row,) = out["results"]
    assert out["config"]["checksum"] is None
    assert "checksum" not in row
    assert row["mrc"]["checksum"] == "blake3"  # as the runs reported it
    assert row["security"]["integrity"]["cost_vs_none"] == 0.0  # (the same made-up runs)


def test_tcp_cpu_per_gib_medians_and_mrc_cpu_against_them() -> None:
    out = _out(_args("--compare", "tcp"))
    (row,) = out["results"]
    tcp = row["tcp"]
    assert (tcp["send_cpu_s_per_gib_median"], tcp["recv_cpu_s_per_gib_median"]) == (0.5, 0.6)
    assert tcp["runs"] == TCP_RUNS
    # MRC (blake3's runs): 2.1 + 2.0 s/GiB; TCP 0.5 + 0.6
    m = row["mrc"]
    assert (m["send_cpu_s_per_gib_median"], m["recv_cpu_s_per_gib_median"]) == (2.1, 2.0)
    assert row["mrc_cpu_vs_tcp"] == round(4.1 / 1.1, 3) == 3.727
    assert row["mrc_vs_tcp"] == round(3.1 / 15.5, 3)
    # the schema wants the ratio beside tcp, and each run's CPU
    del row["mrc_cpu_vs_tcp"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(out, SCHEMA)
    row["mrc_cpu_vs_tcp"] = 3.727
    del tcp["runs"][0]["recv_cpu_s_per_gib"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(out, SCHEMA)


def test_mrc_cpu_vs_tcp_is_null_where_a_side_is_unknown() -> None:
    # no TCP receiver said its CPU: a median of nothing, and no ratio
    blind = _out(_args("--compare", "tcp"), [_tcp(15.0, 0.5, None), _tcp(16.0, 0.4, None)])
    (row,) = blind["results"]
    assert row["tcp"]["send_cpu_s_per_gib_median"] == 0.45
    assert row["tcp"]["recv_cpu_s_per_gib_median"] is None
    assert row["mrc_cpu_vs_tcp"] is None
    # a run that could not tell is left out of the median, not counted as nothing
    part = _out(_args("--compare", "tcp"), [_tcp(15.0, 0.5, None), _tcp(16.0, 0.4, 0.7)])
    assert part["results"][0]["tcp"]["recv_cpu_s_per_gib_median"] == 0.7
    assert part["results"][0]["mrc_cpu_vs_tcp"] == round(4.1 / 1.15, 3)
    # MRC's side unknown
    assert (
        qp.cpu_vs(
            {"send_cpu_s_per_gib_median": None, "recv_cpu_s_per_gib_median": 2.0},
            {"send_cpu_s_per_gib_median": 0.5, "recv_cpu_s_per_gib_median": 0.6},
        )
        is None
    )
    assert (
        qp.cpu_vs(
            {"send_cpu_s_per_gib_median": 1.0, "recv_cpu_s_per_gib_median": 2.0},
            {"send_cpu_s_per_gib_median": 0.0, "recv_cpu_s_per_gib_median": 0.0},
        )
        is None
    )
    # no tcp compared: no ratio at all (the schema wants it only beside tcp)
    (alone,) = _out(_args("--compare", "raw"))["results"]
    assert "mrc_cpu_vs_tcp" not in alone and "tcp" not in alone


# ---- the table ---------------------------------------------------------------------------


def test_table_shows_tcp_cpu_per_side_and_mrc_cpu_over_tcp() -> None:
    lines = table(_out(_args("--compare", "tcp"))).splitlines()
    head = " ".join(lines[0].split())
    assert head.endswith("| tcp Gbit/s MRC/tcp tcp CPU snd/rcv CPU/tcp")
    assert lines[2].split()[-5:] == ["|", "15.500", "0.200", "0.50/0.60", "3.73"]
    assert len(lines[2]) == len(lines[0])  # the cells no wider than their heads
    assert "CPU/tcp = MRC's CPU s/GiB, snd + rcv, over TCP's" in lines[-1]
    blind = _out(_args("--compare", "tcp"), [_tcp(15.0, None, None)])
    assert table(blind).splitlines()[2].split()[-3:] == ["0.207", "-/-", "-"]
    # without tcp, no TCP CPU columns and no word of them
    raw = table(_out(_args("--compare", "raw")))
    assert "CPU/tcp" not in raw and "tcp CPU" not in raw


def test_table_has_a_row_per_checksum_with_each_sides_cpu_and_cost() -> None:
    out = _out(_args("--checksum", "blake3,xxh3-128,sha256", "--compare", "tcp"))
    lines = table(out).splitlines()
    head = lines[0].split()
    assert head[:5] == ["links", "payload", "|", "checksum", "MRC"]
    assert lines[2].split()[:8] == ["1", "8192", "|", "blake3", "3.100", "47.3", "0", "2.10/2.00"]
    i = lines.index("") + 1  # the checksum table below the main one
    # (cells compared with single spaces between them: the widths are render's business)
    assert [" ".join(line.split()) for line in lines[i : i + 4]] == [
        "links payload | checksum Gbit/s cost | snd CPU s/GiB snd +/- | rcv CPU s/GiB rcv +/-",
        "1 8192 | blake3 3.100 0.0% | 2.10 +0.00 | 2.00 +0.00",
        "1 8192 | xxh3-128 3.400 -9.7% | 1.85 -0.25 | 1.75 -0.25",
        "1 8192 | sha256 2.700 12.9% | 2.55 +0.45 | 2.45 +0.45",
    ]
    assert lines[i + 4].startswith("(cost: goodput lost against blake3;")
    assert lines[i + 4].endswith("+/-: more than blake3's)")
    assert "security" not in table(out)  # one mode: no security table


def test_table_without_several_checksums_is_as_before_plus_the_checksum_column() -> None:
    out = _out(_args("--compare", "tcp"))
    lines = table(out).splitlines()
    assert lines[2].split()[3] == "blake3"  # the checksum the runs reported
    assert len(lines) == 4  # head, rule, the row, the foot: no table below
    assert checksum_table(out["results"]) == []
    one = _out(_args("--checksum", "sha256", "--compare", "tcp"))
    assert checksum_table(one["results"]) == []  # one checksum: nothing to compare


def test_table_shows_a_checksum_without_runs_as_dashes() -> None:
    results: list[Mapping[str, Any]] = [
        {
            "links": 2,
            "payload": 1400,
            "checksum": qp.checksum_summary(
                {"blake3": RUNS["blake3"], "sha256": []}, {"blake3": [], "sha256": ["failed"]}
            ),
        }
    ]
    lines = checksum_table(results)
    assert lines[0] == "" and len(lines) == 5  # a blank line, the head, two rows, the foot
    assert " ".join(lines[3].split()) == "2 1400 | sha256 - - | - - | - -"


def test_qp_settings_reach_mrc_send_in_order_and_bad_ones_are_usage_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    a = _args("--qp", "cc.max_cwnd=16000000", "--qp", "ack_every=4")
    assert a.qp == ["cc.max_cwnd=16000000", "ack_every=4"]
    assert _args().qp == []
    with pytest.raises(SystemExit) as exc:
        _args("--qp", "no_such_knob=1")
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
