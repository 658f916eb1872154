"""The lab: everything mrc uses to test and measure itself, none of which the library needs.

* :mod:`mrc.lab.fabric` builds multi-plane SRv6 fabrics of Linux routers in network namespaces
  (pyroute2, root, the eBPF trimmer): ``mrc-fabric``;
* :mod:`mrc.lab.bench` runs collective workloads over them, MRC next to TCP and MPTCP
  (``mrc-bench``), and holds the other benchmarks: one QP against the machine's limits
  (tools/bench_qp.py), one QP over a shaped fabric (tools/bench_fabric.py), trimming
  (``python -m mrc.lab.bench.trim``);
* :mod:`mrc.lab.failover` is the failover demo (tools/failover_demo.py) and its figures;
* :mod:`mrc.lab.harness` is what all of them share: children started in fabric hosts and
  always stopped, their JSON results, medians, the machine object, the JSON envelope;
* :mod:`mrc.lab.sim` and :mod:`mrc.lab.sim_links` are the seeded simulated network that drives
  the sans-IO core deterministically;
* :mod:`mrc.lab.testbed` is the two-host namespace pair of the demo and the tests.

The rule is one-way: the lab imports the library, the library (``mrc.core``, ``mrc.wire``,
``mrc.transport``, ``mrc.connection``, ``mrc.security``, ``mrc.metrics``, ``mrc.srv6``,
``mrc.topology`` and the ``mrc-send``/``mrc-recv`` commands) never imports the lab;
tests/test_import_core.py holds it to that. This package imports nothing by itself, so the
simulator loads without pyroute2.
"""
