"""``mrc-bench``: collective workloads as synchronized steps, MRC vs TCP vs MPTCP.

* :mod:`mrc.lab.bench.coordinator` builds fabrics, starts one agent per host, runs the steps;
* :mod:`mrc.lab.bench.agent` is the per-host process (``python -m mrc.lab.bench.agent``);
* :mod:`mrc.lab.bench.workloads` says who writes what to whom in a step;
* :mod:`mrc.lab.bench.report` makes the markdown table, the aims and the plots.

Beside it, the other benchmarks: :mod:`mrc.lab.bench.qp` (tools/bench_qp.py),
:mod:`mrc.lab.bench.fabric` (tools/bench_fabric.py), :mod:`mrc.lab.bench.trim` (``python -m
mrc.lab.bench.trim``), and :mod:`mrc.lab.bench.failover_roles`, the processes of the failover
demo. See docs/BENCH.md.
"""
