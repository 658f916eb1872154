"""The README's library example must run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_library_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python example"
    res = subprocess.run(
        [sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    m = re.fullmatch(r"placed (\d+) packets on (\d+) EVs\n", res.stdout)
    assert m, res.stdout
    assert int(m.group(1)) >= (6 << 20) // 1400
    # every EV carried some: bursts at 1400 bytes hold up to 45 packets (one GSO send), so
    # 6 MiB makes at least 100 of them, more than one round of the 64 EVs
    assert int(m.group(2)) == 64
