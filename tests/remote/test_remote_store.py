"""Remote stores without FUSE (models added with --fast: what is tested here does not depend on codecs): push, the snapshot a host reads, the block cache, prune, and what a
damaged or hostile remote gives. Every test runs against a real S3 engine (SeaweedFS on 127.0.0.1,
lmzfs/testing/seaweed.py), on real model files."""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lmzfs.reader.remotearchive import RemoteArchive, RemoteOptions
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.remote.blockcache import BLOCK_BYTES, BlockCache, cached_blocks
from lmzfs.store.remote.fetch import MAX_GET_BYTES, RangeFetcher
from lmzfs.store.remote.format import POINTER_KEY, Pointer, parse_pack_key
from lmzfs.store.remote.objects import ObjectStore, RemoteConflict, RemoteURL
from lmzfs.store.remote.prune import prune
from lmzfs.store.remote.push import push
from lmzfs.testing.killpoints import kill_at_marker, kill_at_point
from lmzfs.testing.storedigests import archive_digests

LMZ = [sys.executable, "-m", "lmzfs"]


def lmz(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([*LMZ, *args], capture_output=True, text=True)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


read_all = archive_digests      # model/path -> SHA-256 of what a RemoteArchive serves


def expected(models: dict[str, Path], names) -> dict[str, str]:
    return {f"{n}/{p.relative_to(models[n])}": sha(p) for n in names for p in sorted(models[n].rglob("*"))
            if p.is_file()}


def opened(url: str, cache: Path, **kw) -> RemoteArchive:
    return RemoteArchive(RemoteOptions(url, cache_dir=cache, poll_s=0, timeout_s=10, **kw), workers=0)


def test_a_pushed_store_reads_back_byte_for_byte_and_moves_only_its_stored_bytes(tmp_path, remote_url, models):
    store = StorePaths(tmp_path / "store")
    lmz("--store", str(store.root), "add", "--fast", str(models["minilm"]))
    r = push(store, ObjectStore(RemoteURL.parse(remote_url)))
    assert r.published and r.generation == 1 and r.chunks_uploaded == r.chunks_total
    archive = opened(remote_url, tmp_path / "cache")
    try:
        assert read_all(archive) == expected(models, ["minilm"])
        fetched = archive.packs.fetcher.stats.bytes_fetched
        assert r.stored_bytes <= fetched <= 1.03 * r.stored_bytes
    finally:
        archive.close()


def test_a_second_push_moves_nothing_and_a_new_model_moves_only_its_new_chunks(tmp_path, remote_url, models):
    store = StorePaths(tmp_path / "store")
    objects = ObjectStore(RemoteURL.parse(remote_url))
    lmz("--store", str(store.root), "add", "--fast", str(models["minilm"]))
    first = push(store, objects)
    again = push(store, objects)
    assert (again.published, again.bytes_uploaded, again.generation) == (False, 0, 1)
    # the same bytes under another name: no chunk is new
    lmz("--store", str(store.root), "add", "--fast", str(models["minilm"]), "--name", "minilm-copy")
    copy = push(store, objects)
    assert (copy.published, copy.chunks_uploaded, copy.generation) == (True, 0, 2)
    lmz("--store", str(store.root), "add", "--fast", str(models["smollm2"]))
    grown = push(store, objects)
    assert grown.generation == 3 and 0 < grown.chunks_uploaded < grown.chunks_total
    assert grown.chunks_total == first.chunks_total + grown.chunks_uploaded
    archive = opened(remote_url, tmp_path / "cache")
    try:
        want = expected(models, ["minilm", "smollm2"])
        want.update({k.replace("minilm/", "minilm-copy/"): v for k, v in want.items() if k.startswith("minilm/")})
        assert read_all(archive) == want
    finally:
        archive.close()


def test_a_push_over_a_snapshot_someone_else_replaced_stops_and_a_rerun_publishes(tmp_path, remote_url, models):
    a, b = StorePaths(tmp_path / "a"), StorePaths(tmp_path / "b")
    objects = ObjectStore(RemoteURL.parse(remote_url))
    lmz("--store", str(a.root), "add", "--fast", str(models["minilm"]))
    lmz("--store", str(b.root), "add", "--fast", str(models["smollm2"]))
    push(a, objects)
    stale = objects.head(POINTER_KEY).etag
    push(b, objects)                            # b's snapshot replaces a's
    with pytest.raises(RemoteConflict):
        objects.put(POINTER_KEY, b"{}", if_match=stale)
    with pytest.raises(RemoteConflict):
        objects.put(POINTER_KEY, b"{}", create=True)
    archive = opened(remote_url, tmp_path / "cache")
    try:
        assert read_all(archive) == expected(models, ["smollm2"])
    finally:
        archive.close()


@pytest.mark.parametrize("point", ["push-record", "push-data", "push-object", "push-snapshot", "push-published"])
def test_a_push_killed_at_a_named_point_leaves_a_snapshot_serving_and_a_rerun_completes(
        tmp_path, remote_url, models, point):
    store = tmp_path / "store"
    lmz("--store", str(store), "add", "--fast", str(models["minilm"]))
    lmz("--store", str(store), "push", remote_url)
    lmz("--store", str(store), "add", "--fast", str(models["smollm2"]))
    kill_at_point([*LMZ, "--store", str(store), "push", remote_url], point)
    archive = opened(remote_url, tmp_path / "cache-after-kill")
    try:
        served = read_all(archive)
    finally:
        archive.close()
    published = point == "push-published"
    assert served == expected(models, ["minilm", "smollm2"] if published else ["minilm"])
    rerun = lmz("--store", str(store), "push", remote_url).stdout
    if point == "push-object":
        assert "left by an interrupted push reused" in rerun
    assert "verify: 3 file(s)" in lmz("verify", "--remote", remote_url, "--cache-dir", str(tmp_path / "v")).stdout


def test_pushes_killed_at_random_moments_never_break_the_remote(tmp_path, remote_url, models):
    store = tmp_path / "store"
    lmz("--store", str(store), "add", "--fast", str(models["minilm"]))
    lmz("--store", str(store), "push", remote_url)
    lmz("--store", str(store), "add", "--fast", str(models["smollm2"]))
    rng = random.Random(45)
    for i in range(6):
        proc = subprocess.Popen([*LMZ, "--store", str(store), "push", remote_url],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.3, 2.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        archive = opened(remote_url, tmp_path / f"cache-{i}")
        try:
            served = read_all(archive)
        finally:
            archive.close()
        assert served in (expected(models, ["minilm"]), expected(models, ["minilm", "smollm2"]))
    lmz("--store", str(store), "push", remote_url)
    out = lmz("verify", "--remote", remote_url, "--cache-dir", str(tmp_path / "v")).stdout
    assert "verify: 3 file(s)" in out and out.rstrip().endswith(": ok")


def test_the_catalog_copy_a_killed_push_leaves_is_removed_by_the_next_push_but_a_running_ones_is_not(
        tmp_path, remote_url, models):
    store, tmp = tmp_path / "store", tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    lmz("--store", str(store), "add", "--fast", str(models["minilm"]))
    push_argv = [*LMZ, "--store", str(store), "push"]
    kill_at_marker([*push_argv, remote_url], "HERE", env={**env, "LMZ_KILL_AT": "push-snapshot"})
    (left,) = tmp.glob("lmz-push-*")
    assert (left / "snapshot.sqlite").stat().st_size > 0
    # a push waiting at its point holds its directory: another push (to another remote) leaves it
    waiting = subprocess.Popen([*push_argv, remote_url + "-waiting"], stdout=subprocess.PIPE, text=True,
                               env={**env, "LMZ_KILL_AT": "push-snapshot"})
    try:
        assert waiting.stdout.readline().strip() == "HERE"
        (held,) = tmp.glob("lmz-push-*")
        assert held != left                 # the killed push's directory went when this push began
        r = subprocess.run([*push_argv, remote_url + "-other"], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        assert list(tmp.glob("lmz-push-*")) == [held]
    finally:
        waiting.kill()
        waiting.wait()
        waiting.stdout.close()
    # what a push killed while it removed its directory leaves (its lock file gone first), and
    # what a push of an earlier lmzfs left (no lock file at all)
    (tmp / "lmz-push-halfgone").mkdir()
    (tmp / "lmz-push-halfgone" / "snapshot.sqlite").write_bytes(b"x" * 4096)
    # what a push killed while it made its directory leaves (under its first name), and one that a
    # push makes right now (young: kept)
    for name, age in ((".lmz-push-killedearly", 600), (".lmz-push-beingmade", 0)):
        (tmp / name).mkdir()
        (tmp / name / ".lock").write_bytes(b"")
        os.utime(tmp / name, (time.time() - age, time.time() - age))
    r = subprocess.run([*push_argv, remote_url], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "generation 1" in r.stdout, r.stderr
    assert list(tmp.glob("lmz-push-*")) == [] and list(tmp.glob(".lmz-push-*")) == [tmp / ".lmz-push-beingmade"]


def test_the_disk_cache_stays_within_its_cap_while_a_model_three_times_larger_is_read(tmp_path, remote_url, models):
    store = StorePaths(tmp_path / "store")
    lmz("--store", str(store.root), "add", "--fast", str(models["minilm"]))
    r = push(store, ObjectStore(RemoteURL.parse(remote_url)))
    cap = r.stored_bytes // 3
    archive = opened(remote_url, tmp_path / "cache", disk_cache_bytes=cap)
    try:
        assert read_all(archive) == expected(models, ["minilm"])
        assert 0 < archive.blocks.size_bytes <= cap * 1.05
        assert archive.blocks.stats.evicted > 0
    finally:
        archive.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "zeroed"])
def test_a_damaged_cached_block_is_fetched_again_never_served(tmp_path, remote_url, models, damage):
    store = StorePaths(tmp_path / "store")
    lmz("--store", str(store.root), "add", "--fast", str(models["minilm"]))
    push(store, ObjectStore(RemoteURL.parse(remote_url)))
    cache = tmp_path / "cache"
    archive = opened(remote_url, cache)
    try:
        read_all(archive)
    finally:
        archive.close()
    rng = random.Random(7)
    held = cached_blocks(cache)
    if damage == "truncate":
        # one object file cut in the middle of a block: that block and every one after it are damaged
        victim = rng.choice([b for b in held if b.block > 0])
        cut = victim.offset + victim.length // 2
        os.truncate(victim.path, cut)
        damaged = [b for b in held if b.path == victim.path and b.offset + b.length > cut]
    else:
        damaged = rng.sample(held, 5)
        for b in damaged:
            with open(b.path, "r+b") as f:
                f.seek(b.offset)
                raw = bytearray(f.read(b.length))
                if damage == "flip":
                    i = rng.randrange(len(raw))
                    raw[i] ^= 1 << rng.randrange(8)
                else:                       # its bytes lost (a power cut after its slot was written)
                    raw = bytearray(len(raw))
                f.seek(b.offset)
                f.write(raw)
    archive = opened(remote_url, cache)
    try:
        assert read_all(archive) == expected(models, ["minilm"])
        assert archive.blocks.stats.damaged == len(damaged)
        assert archive.packs.fetcher.stats.bytes_fetched == sum(b.length for b in damaged)
    finally:
        archive.close()
    assert [(b.path, b.block) for b in cached_blocks(cache)] == [(b.path, b.block) for b in held]


def test_prune_deletes_what_no_recent_snapshot_names_and_the_current_one_keeps_reading(tmp_path, remote_url, models):
    store = tmp_path / "store"
    objects = ObjectStore(RemoteURL.parse(remote_url))
    lmz("--store", str(store), "add", "--fast", str(models["minilm"]))
    lmz("--store", str(store), "add", "--fast", str(models["smollm2"]))
    lmz("--store", str(store), "push", remote_url)
    lmz("--store", str(store), "rm", "smollm2")
    lmz("--store", str(store), "gc")
    lmz("--store", str(store), "push", remote_url)
    kept = prune(objects)                        # the default grace keeps everything this young
    assert (kept.objects_deleted, kept.snapshots_deleted) == (0, 0)
    before = {o.key for o in objects.list("")}
    out = lmz("--store", str(store), "push", remote_url, "--prune", "--grace", "0").stdout
    after = {o.key for o in objects.list("")}
    assert "pruned" in out
    gone = before - after
    assert gone and all(k.startswith(("packs/", "snapshots/")) for k in gone)
    assert len([k for k in after if k.startswith("snapshots/")]) == 1
    archive = opened(remote_url, tmp_path / "cache")
    try:
        assert read_all(archive) == expected(models, ["minilm"])
        named = {p.key for p in archive.current_snapshot.manifest.packs.values()}
    finally:
        archive.close()
    assert {k for k in after if k.endswith(".lmzp")} == named


def test_a_damaged_or_foreign_pointer_is_one_line_and_no_traceback(tmp_path, remote_url, models):
    store = tmp_path / "store"
    objects = ObjectStore(RemoteURL.parse(remote_url))
    lmz("--store", str(store), "add", "--fast", str(models["minilm"]))
    lmz("--store", str(store), "push", remote_url)
    good = objects.get(POINTER_KEY)
    cases = {
        b"\x00garbage": "pointer is damaged",
        json.dumps({"format": "something-else"}).encode(): "not an lmzfs remote store pointer",
        json.dumps({**json.loads(good), "version": 99}).encode(): "pointer version 99 is not supported",
        json.dumps({**json.loads(good), "sha256": "0" * 64}).encode(): "does not match the pointer's checksum",
    }
    for raw, message in cases.items():
        objects.put(POINTER_KEY, raw)
        r = lmz("ls", "--remote", remote_url, "--cache-dir", str(tmp_path / "c"), check=False)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    objects.put(POINTER_KEY, good)
    assert "minilm" in lmz("ls", "--remote", remote_url, "--cache-dir", str(tmp_path / "c")).stdout


def test_a_pack_object_of_an_unknown_version_is_refused_with_eio(tmp_path, remote_url, models):
    store = StorePaths(tmp_path / "store")
    objects = ObjectStore(RemoteURL.parse(remote_url))
    lmz("--store", str(store.root), "add", "--fast", str(models["minilm"]))
    push(store, objects)
    key = next(o.key for o in objects.list("packs/") if o.key.endswith(".lmzp"))
    raw = bytearray(objects.get(key))
    raw[8] = 9                                   # the pack header's version
    objects.delete([key])
    objects.put(key, bytes(raw))
    r = lmz("cat", "--remote", remote_url, "--cache-dir", str(tmp_path / "c"), "minilm/model.safetensors",
            check=False)
    assert r.returncode == 1 and "pack version 9 is not supported" in r.stderr and "Traceback" not in r.stderr


def test_an_empty_or_unreachable_remote_is_one_line(tmp_path, remote_url):
    r = lmz("ls", "--remote", remote_url, "--cache-dir", str(tmp_path / "c"), check=False)
    assert r.returncode == 2 and "no lmzfs store there yet" in r.stderr and r.stderr.count("\n") == 1
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    t0 = time.monotonic()
    r = subprocess.run([*LMZ, "ls", "--remote", remote_url, "--cache-dir", str(tmp_path / "c")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "the remote did not answer" in r.stderr and r.stderr.count("\n") == 1
    assert time.monotonic() - t0 < 45


def test_remote_urls_refuse_credentials_and_what_is_not_a_store_url():
    for text, message in [("s3://key:secret@bucket/p", "may not carry credentials"),
                          ("ftp://host/p", "not a remote store"), ("s3:///p", "not a remote store"),
                          ("s3://bucket/a/../b", "not a remote store prefix")]:
        with pytest.raises(StoreError, match=message):
            RemoteURL.parse(text)
    assert str(RemoteURL.parse("s3://bucket/models/")) == "s3://bucket/models"
    assert parse_pack_key("packs/00000007-0123456789abcdef.lmzp") == (7, "0123456789abcdef", "lmzp")
    assert Pointer.decode(Pointer(3, "snapshots/000000000003-0123456789abcdef.lmzs", "a" * 64, 10, 1.0).encode(),
                          "x").generation == 3


def test_credentials_from_an_aws_credentials_file_reach_the_engine_through_boto3s_chain(tmp_path, remote_url, models,
                                                                                      s3_env):
    store = tmp_path / "store"
    lmz("--store", str(store), "add", "--fast", str(models["minilm"]))
    creds = tmp_path / "aws-credentials"
    creds.write_text(f"[default]\naws_access_key_id = {os.environ['AWS_ACCESS_KEY_ID']}\n"
                     f"aws_secret_access_key = {os.environ['AWS_SECRET_ACCESS_KEY']}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_CONFIG_FILE=str(tmp_path / "none"))
    r = subprocess.run([*LMZ, "--store", str(store), "push", remote_url], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "pushed to" in r.stdout, r.stderr
    r = subprocess.run([*LMZ, "stats", "--remote", remote_url, "--cache-dir", str(tmp_path / "c")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert f"remote {remote_url}: generation 1" in r.stdout and "1 model(s), 2 file(s)" in r.stdout
    creds.write_text("[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n")
    r = subprocess.run([*LMZ, "stats", "--remote", remote_url, "--cache-dir", str(tmp_path / "c2")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "wrong" not in r.stderr, r.stderr


def test_a_fine_tune_whose_add_recodes_pushed_chunks_as_deltas_reads_back_from_the_remote(tmp_path, remote_url,
                                                                                         models):
    """Adding a fine-tune recodes chunks of the model it pairs with as deltas against it: the same
    chunk ids with other payloads. The remote must get those payloads, not keep the old ones under
    the new rows."""
    store = StorePaths(tmp_path / "store")
    objects = ObjectStore(RemoteURL.parse(remote_url))
    lmz("--store", str(store.root), "add", str(models["minilm"]))
    push(store, objects)
    tuned = tmp_path / "minilm-tuned"
    shutil.copytree(models["minilm"], tuned)
    raw = bytearray((tuned / "model.safetensors").read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + (1 << 20)] = bytes(b ^ 0x01 for b in raw[mid:mid + (1 << 20)])
    (tuned / "model.safetensors").write_bytes(bytes(raw))
    lmz("--store", str(store.root), "add", str(tuned))
    r = push(store, objects)
    assert r.published and r.chunks_uploaded > 0
    archive = opened(remote_url, tmp_path / "cache")
    try:
        want = expected(models, ["minilm"])
        want["minilm-tuned/model.safetensors"] = hashlib.sha256(bytes(raw)).hexdigest()
        want["minilm-tuned/config.json"] = want["minilm/config.json"]
        assert read_all(archive) == want
    finally:
        archive.close()


def test_a_remote_emptied_and_pushed_again_from_generation_one_reads_through_a_cache_of_later_generations(
        tmp_path, remote_url, models):
    objects = ObjectStore(RemoteURL.parse(remote_url))
    cache = tmp_path / "cache"
    first = StorePaths(tmp_path / "first")
    for name, extra in (("minilm", []), ("minilm", ["--name", "minilm-copy"]), ("smollm2", []),
                        ("smollm2", ["--name", "smollm2-copy"])):
        lmz("--store", str(first.root), "add", "--fast", str(models[name]), *extra)
        push(first, objects)
        opened(remote_url, cache).close()      # generations 1 to 4 cached on this host
    objects.delete([info.key for info in objects.list("")])
    second = StorePaths(tmp_path / "second")
    lmz("--store", str(second.root), "add", "--fast", str(models["smollm2"]))
    assert push(second, objects).generation == 1
    archive = opened(remote_url, cache)
    try:
        assert read_all(archive) == expected(models, ["smollm2"])
    finally:
        archive.close()


def test_a_pack_object_larger_than_a_part_is_uploaded_in_parts_and_reads_back(tmp_path, remote_url, models):
    from lmzfs.store.remote.push import PART_BYTES
    store = StorePaths(tmp_path / "store")
    lmz("--store", str(store.root), "add", "--fast", str(models["smollm2"]))
    objects = ObjectStore(RemoteURL.parse(remote_url))
    assert push(store, objects).published
    packs = [info for info in objects.list("") if (parse_pack_key(info.key) or (0, "", ""))[2] == "lmzp"]
    big = max(packs, key=lambda info: info.size)
    assert big.size > PART_BYTES
    # S3's ETag of a multipart upload is the digest of its parts' digests, then "-" and the parts' count
    assert big.etag.strip('"').endswith(f"-{-(-big.size // PART_BYTES)}"), big.etag
    archive = opened(remote_url, tmp_path / "cache")
    try:
        assert read_all(archive) == expected(models, ["smollm2"])
    finally:
        archive.close()


def pushed_pack(tmp_path, remote_url, models):
    """minilm pushed to the remote: (its ObjectStore, the largest pack object's info)."""
    store = StorePaths(tmp_path / "store")
    lmz("--store", str(store.root), "add", "--fast", str(models["minilm"]))
    objects = ObjectStore(RemoteURL.parse(remote_url), timeout=10)
    push(store, objects)
    return objects, max((o for o in objects.list("packs/") if o.key.endswith(".lmzp")), key=lambda o: o.size)


class _CacheThatBreaksOnce(BlockCache):
    """A real disk cache whose first write fails as no cache write should (a fault injected into it)."""
    broke = False

    def put(self, key: str, size: int, block: int, data) -> None:
        if not self.broke:
            self.broke = True
            raise RuntimeError("the cache broke")
        super().put(key, size, block, data)


def test_a_fetch_whose_cache_write_breaks_settles_every_waiting_read_and_the_next_read_is_exact(tmp_path, remote_url,
                                                                                                 models):
    objects, pack = pushed_pack(tmp_path, remote_url, models)
    assert pack.size > 3 * BLOCK_BYTES
    want = bytes(objects.get_range(pack.key, 0, 3 * BLOCK_BYTES))
    fetcher = RangeFetcher(objects, _CacheThatBreaksOnce(tmp_path / "cache", 1 << 30))
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(fetcher.read, pack.key, pack.size, 0, 3 * BLOCK_BYTES)
            with pytest.raises(RuntimeError, match="the cache broke"):
                first.result(timeout=30)           # an error, not a read that waits for ever
        assert bytes(fetcher.read(pack.key, pack.size, 0, 3 * BLOCK_BYTES)) == want
        assert bytes(fetcher.read(pack.key, pack.size, BLOCK_BYTES, BLOCK_BYTES)) == want[BLOCK_BYTES:2 * BLOCK_BYTES]
    finally:
        fetcher.close()
        fetcher.cache.close()


def test_a_read_of_many_blocks_after_the_fetcher_closed_fails_and_leaves_nothing_waiting(tmp_path, remote_url, models):
    objects, pack = pushed_pack(tmp_path, remote_url, models)
    span = 2 * MAX_GET_BYTES + BLOCK_BYTES              # three GETs: one here, two for the pool
    assert pack.size > span
    fetcher = RangeFetcher(objects, BlockCache(tmp_path / "cache", 1 << 30))
    try:
        fetcher.close()
        with ThreadPoolExecutor(1) as pool:
            with pytest.raises(OSError, match="closed"):
                pool.submit(fetcher.read, pack.key, pack.size, 0, span).result(timeout=30)
            # a block of those: failed above, not left claimed, so a read of it alone fetches it here
            got = pool.submit(fetcher.read, pack.key, pack.size, MAX_GET_BYTES, BLOCK_BYTES).result(timeout=30)
        assert bytes(got) == bytes(objects.get_range(pack.key, MAX_GET_BYTES, MAX_GET_BYTES + BLOCK_BYTES))
    finally:
        fetcher.cache.close()


class _CacheLookedEarly(BlockCache):
    """A real disk cache on which one thread's lookup is held until a fetch has landed: the read
    looked (and missed) before the block was cached, and takes its lock only after that fetch is
    over, the interleaving two readers of one block meet on a slow link."""

    def __init__(self, root, capacity):
        super().__init__(root, capacity)
        self.late_reader: int | None = None
        self.looked = threading.Event()
        self.fetcher: RangeFetcher | None = None

    def get(self, key: str, size: int, block: int):
        found = super().get(key, size, block)
        if threading.get_ident() == self.late_reader and found is None:
            self.looked.set()
            deadline = time.monotonic() + 30
            while self.fetcher.stats.requests < 1 and time.monotonic() < deadline:
                time.sleep(0.005)
        return found


def test_a_block_that_lands_while_a_second_reader_looks_for_it_is_fetched_once(tmp_path, remote_url, models):
    objects, pack = pushed_pack(tmp_path, remote_url, models)
    want = bytes(objects.get_range(pack.key, 0, 1000))
    cache = _CacheLookedEarly(tmp_path / "cache", 1 << 30)
    fetcher = cache.fetcher = RangeFetcher(objects, cache)

    def late_read():
        cache.late_reader = threading.get_ident()
        return bytes(fetcher.read(pack.key, pack.size, 0, 1000))

    try:
        with ThreadPoolExecutor(1) as pool:
            late = pool.submit(late_read)
            assert cache.looked.wait(30)
            assert bytes(fetcher.read(pack.key, pack.size, 0, 1000)) == want      # fetches the block
            assert late.result(timeout=30) == want
        assert (fetcher.stats.requests, fetcher.stats.bytes_fetched) == (1, BLOCK_BYTES)
    finally:
        fetcher.close()
        cache.close()
