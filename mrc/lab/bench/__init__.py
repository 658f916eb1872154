"""``mrc-bench``: collective workloads as synchronized steps, MRC vs TCP vs MPTCP.

* :mod:`mrc.lab.bench.coordinator` builds fabrics, starts one agent per host, runs the steps;
* :mod:`mrc.lab.bench.agent` is the per-host process (``python -m mrc.lab.bench.agent``);
* :mod:`mrc.lab.bench.workloads` says who writes what to whom in a step;
* :mod:`mrc.lab.bench.report` makes the JSON, the markdown table, the aims and the plots.

See docs/BENCH.md.
"""
