"""Run a reference receiver and sender as processes, as bench_qp does inside namespaces, here
on loopback: the receiver prints ``ready``, then the sender runs to its end."""

from __future__ import annotations

import subprocess


def run_pair(
    recv_argv: list[str], send_argv: list[str], timeout: float
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The receiver's and the sender's exit and output (each waited for up to ``timeout``
    seconds); the receiver is killed if anything fails on the way."""
    recv = subprocess.Popen(recv_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert recv.stdout is not None
        assert recv.stdout.readline().strip() == "ready"
        send = subprocess.run(send_argv, capture_output=True, text=True, timeout=timeout)
        out, err = recv.communicate(timeout=timeout)
    finally:
        recv.kill()
        recv.wait()
    return subprocess.CompletedProcess(recv_argv, recv.returncode, out, err), send
