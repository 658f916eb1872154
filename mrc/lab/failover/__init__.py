"""The failover demo (tools/failover_demo.py): a link downed and healed under a transfer, MRC
next to TCP and MPTCP.

* :mod:`mrc.lab.failover.demo` runs it: the fabric, the roles in its hosts, the link;
* :mod:`mrc.lab.failover.analysis` computes its figures from what the roles recorded (pure,
  tested on synthetic series);
* :mod:`mrc.lab.failover.report` prints the table and draws the plot.

The roles themselves are :mod:`mrc.lab.bench.failover_roles`.
"""
