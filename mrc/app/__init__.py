"""What sits on a connection: the verified transfers mrc-send and mrc-recv run.

* :mod:`mrc.app.transfer`: a whole buffer, written and then checked end to end (hashes swapped);
* :mod:`mrc.app.rounds`: sending through a region of two slots, round by round, each checked;
* :mod:`mrc.app.timed`: a transfer for a duration instead of a size (``mrc-send --time``);
* :mod:`mrc.app.stream`: what a sender reads (a buffer, generated data) and its running hash.

They use only the public API of :mod:`mrc.connection`; nothing below imports them.
"""
