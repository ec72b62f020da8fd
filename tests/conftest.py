"""Shared fixtures."""
from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import pytest

from lmzfs.testing.corpus import fetch
from lmzfs.testing.smalldisk import CannotMount, small_disk


@pytest.fixture(scope="session", autouse=True)
def no_host_config(tmp_path_factory):
    """Tests never read the host's /etc/lmzfs/config.toml: $LMZ_CONFIG names an empty file, for
    this process and every `lmz` it starts. A test that wants a config sets its own."""
    path = tmp_path_factory.mktemp("config") / "empty.toml"
    path.write_text("")
    previous = os.environ.get("LMZ_CONFIG")
    os.environ["LMZ_CONFIG"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("LMZ_CONFIG", None)
    else:
        os.environ["LMZ_CONFIG"] = previous


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """all-MiniLM-L6-v2, FP32 safetensors (fetched once, cached under ~/.cache/lmzfs)."""
    return fetch("minilm")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct, GGUF v3 Q4_1 (fetched once, cached under ~/.cache/lmzfs)."""
    return fetch("smollm2")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, minilm_path, smollm2_path) -> Path:
    """Both real files, a tokenizer.json, and a second copy of one file under another name."""
    import shutil
    d = tmp_path_factory.mktemp("model")
    shutil.copyfile(minilm_path, d / "model.safetensors")
    shutil.copyfile(smollm2_path, d / "model.gguf")
    (d / "sub").mkdir()
    shutil.copyfile(minilm_path, d / "sub" / "copy-of-model.safetensors")
    (d / "tokenizer.json").write_text(
        '{"version": "1.0", "model": {"type": "WordPiece", "vocab": {' +
        ", ".join(f'"tok{i}": {i}' for i in range(5000)) + "}}}\n")
    return d


@pytest.fixture
def tmpfs(tmp_path):
    """tmpfs(size, name="disk"): a tmpfs of that size (mount's size=, "12m") at tmp_path/name, to
    run out of space on; unmounted when the test ends. Skips the test where mounting one is not
    allowed (not root)."""
    with contextlib.ExitStack() as stack:
        def mount(size: str, name: str = "disk") -> Path:
            try:
                return stack.enter_context(small_disk(tmp_path / name, size))
            except CannotMount as exc:
                pytest.skip(str(exc))
        yield mount


@pytest.fixture
def store_dir(tmp_path) -> Path:
    return tmp_path / "store"


class _WarningCatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def fail_on_logged_warnings(request):
    """Like S3QL's tests: anything logged at WARNING or above fails the test unless it asks for it
    with @pytest.mark.allow_log_warnings."""
    catcher = _WarningCatcher()
    root = logging.getLogger()
    root.addHandler(catcher)
    try:
        yield
    finally:
        root.removeHandler(catcher)
    if catcher.records and request.node.get_closest_marker("allow_log_warnings") is None:
        msgs = "; ".join(f"{r.name}: {r.getMessage()}" for r in catcher.records[:5])
        pytest.fail(f"unexpected log warnings: {msgs}")
