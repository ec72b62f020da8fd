"""Issue 50: over a real link, a model loads faster from the remote store than the plain file does.

Opt-in (a minute or two, root, iproute2, SeaweedFS, the astra corpus file): LMZ_SHAPED_LINK=1.
Runs bench/link_table.py at 1 Gbit/s: a private network namespace whose loopback carries the S3
engine's traffic through a token bucket, the engine, the mount and the plain fetcher all inside it.
bench/run.py's `link` section measures the same at more rates and with the loaders
(docs/results.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("LMZ_SHAPED_LINK") != "1",
                                 reason="long: set LMZ_SHAPED_LINK=1 to run the engine and a mount behind a shaped link")]

ROOT = Path(__file__).resolve().parents[2]
LINK_BYTES_PER_S = 1e9 / 8


def _astra() -> Path:
    from lmzfs.testing.corpus import fetch
    try:
        return Path(fetch("astra"))
    except Exception as exc:            # offline: nothing to measure
        pytest.skip(f"the astra corpus file is not available: {exc}")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_a_cold_read_through_the_remote_mount_beats_the_plain_file_over_a_1gbit_link(tmp_path):
    from lmzfs.testing.netns import available
    reason = available()
    if reason:
        pytest.skip(reason)
    astra = _astra()
    before = _namespaces()
    out = tmp_path / "link.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "link_table.py"), "--file", f"astra={astra}",
                           "--json", str(out), "--runs", "1", "--rates", "1gbit", "--load-rate", "",
                           "--tmpdir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=1200)
    assert _namespaces() <= before, "the shaped link's namespace was left behind"
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert not res.get("error"), res["error"]
    size = res["files"]["astra"]["bytes"]
    (row,) = res["rates"]["1gbit"]["reads"]["astra"]
    plain, mount = row["plain"], row["mount"]
    assert "error" not in plain and "error" not in mount, row
    assert mount["sha256_ok"]
    # the link is shaped: the plain file cannot come faster than 1 Gbit/s, and all of it crossed it
    assert plain["wire_bytes"] >= size
    assert size / plain["seconds"] <= 1.05 * LINK_BYTES_PER_S
    # the mount moved its stored bytes (a third less than the file), not the file
    assert mount["wire_bytes"] <= 1.03 * mount["fetched_bytes"] and mount["fetched_bytes"] < 0.8 * size
    # and that shows: the cold read through the remote mount beats the plain GET stream
    assert mount["seconds"] < plain["seconds"], row
