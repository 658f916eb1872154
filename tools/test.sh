#!/usr/bin/env bash
# Check lint, format and types (tools/lint.sh, before anything needs root), set everything up
# (tools/setup.sh), then run the whole test suite, then the data path's tests again with
# MRC_NATIVE=0 (the pure-Python twins of the native kernels, what a machine without a compiler
# runs): the core's (records, trains, 600 seeded simulations, reliability, bursts, hostile
# datagrams) and the loopback transfers' (trains, batches, ECN, labels, keys). Any failing step
# fails the run. Extra arguments go to pytest, and then only the first pass runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# the checks need only .venv; a machine whose Python cannot make one yet gets the full setup
# (which installs python3-venv and the headers) first
bash tools/setup.sh --python-only 2>/dev/null || bash tools/setup.sh
bash tools/lint.sh
bash tools/setup.sh

printf '[test] %s\n' "pytest" >&2
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
.venv/bin/python -m pytest -q -p no:cacheprovider
fallback=(
  tests/core/test_fastpath.py tests/core/test_sender_records.py tests/core/test_sim_invariants.py
  tests/core/test_reliability.py tests/core/test_bursts.py tests/core/test_batch_send.py
  tests/core/test_malformed.py tests/core/test_fuzz_datagrams.py tests/core/test_late_copies.py
  tests/transport/test_loopback_cli.py tests/transport/test_native_rx.py
  tests/transport/test_rxbatch.py tests/transport/test_ecn.py tests/transport/test_flowlabel.py
  tests/transport/test_receive_queue.py tests/transport/test_transfer.py
  tests/transport/test_fuzz_datagrams.py tests/transport/test_peer_stall.py
  tests/security/test_sealed_trains.py tests/security/test_open_in_place.py
  tests/security/test_packet.py
)
printf '[test] %s\n' "the data path's tests again with MRC_NATIVE=0 (the Python twins)" >&2
MRC_NATIVE=0 exec .venv/bin/python -m pytest -q -p no:cacheprovider "${fallback[@]}"
