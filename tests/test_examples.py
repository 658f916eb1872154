"""Every script in examples/ runs as written and prints what its docstring promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# per script: patterns every one of which its output must match
EXPECT = {
    "write_and_verify.py": [r"^wrote 6291456 bytes over \d+ EVs: ok$"],
    "keyed_transfer.py": [
        r"^stranger refused: authentication failed: the receiver does not hold our key$",
        r"^encrypted write of 1048576 bytes: ok$",
    ],
    "scrape_metrics.py": [
        r"^mrc_qp_placed_bytes_total 2097152, connection says 2097152$",
    ],
    "dctcp_window.py": [r"^dctcp: .* 0 timeouts, data ok$"],
    "incast_simulation.py": [
        r"^fixed: .* \d+ of 3 QPs failed \(PSN \d+ trimmed 1001 times\)$",
        r"^ nscc: .* 0 timeouts, data ok$",
    ],
}


def test_every_example_is_covered() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECT)
    readme = (EXAMPLES / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in EXPECT)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_example_runs(name: str) -> None:
    res = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    for pattern in EXPECT[name]:
        assert re.search(pattern, res.stdout, re.M), (pattern, res.stdout)
