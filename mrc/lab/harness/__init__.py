"""What every benchmark and demo of the lab needs around the thing it measures.

* :mod:`~mrc.lab.harness.children` starts helper processes in their own process group, collects
  what they print and always stops them (SIGTERM, then SIGKILL to the group);
* :mod:`~mrc.lab.harness.hosts` builds the argv that runs a command in a fabric host (its
  namespace or its container), finds mrc's commands and waits for a listener;
* :mod:`~mrc.lab.harness.fabric` builds a fabric that is always removed, also on SIGTERM, and
  reads what it did to a run's packets (trims, drops);
* :mod:`~mrc.lab.harness.output` reads a child's JSON lines (its result: the last) and its last
  words;
* :mod:`~mrc.lab.harness.stats` holds the statistics the benchmarks report (medians, rounding,
  Jain's fairness index);
* :mod:`~mrc.lab.harness.machine` says which machine and which code measured;
* :mod:`~mrc.lab.harness.envelope` is the JSON object every benchmark prints around its results;
* :mod:`~mrc.lab.harness.table` is the one printer of the tables they show people;
* :mod:`~mrc.lab.harness.peers` are the socket references (``python -m mrc.lab.harness.peers``).

Nothing is imported here, so a module takes only what it uses (the peers start fast in a
namespace, and the machine info loads no netlink).
"""
