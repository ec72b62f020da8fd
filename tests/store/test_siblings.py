"""Deltas between the files of one add: releases of a model kept side by side in one directory.

Small synthetic releases (an F16 tensor drifting a little, an int8 tensor with 5% of its values
redrawn, per release) in one directory; every claim is on bytes read back."""
from __future__ import annotations

import gc
import hashlib
from pathlib import Path

import numpy as np

from lmzfs.cli import main as lmz
from lmzfs.codecs import ChunkHint, encode_chunk
from lmzfs.store.add import add_model
from lmzfs.store.catalog import Catalog
from lmzfs.store.gc import collect_garbage
from lmzfs.store.layout import StorePaths
from lmzfs.store.remove import remove_models
from lmzfs.store.write.policy import EncodePolicy
from lmzfs.store.write.siblings import SiblingRef, encode_against
from lmzfs.admin.verify import verify_store
from lmzfs.testing.mount import mounted
from lmzfs.testing.storedigests import served_digests


def releases(root: Path, n: int, seed: int = 0, size: int = 1 << 19) -> Path:
    """One directory holding n releases, model-v0.safetensors ... model-v{n-1}.safetensors."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(size).astype(np.float16)
    q = rng.integers(-127, 127, size, dtype=np.int8)
    root.mkdir(parents=True)
    for k in range(n):
        w = (w + (rng.standard_normal(size) * 1e-3).astype(np.float16)).astype(np.float16)
        q = q.copy()
        redrawn = rng.random(size) < 0.05
        q[redrawn] = rng.integers(-127, 127, int(redrawn.sum()), dtype=np.int8)
        save_file({"w": w, "q": q}, str(root / f"model-v{k}.safetensors"))
    return root


def originals(src: Path, model: str) -> dict[str, str]:
    return {f"{model}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(src.iterdir())}


def chunk_depths(store: StorePaths, model: str) -> dict[str, int]:
    """For each file of the model, the most references a read of one of its chunks follows."""
    cat = Catalog(store.catalog, readonly=True)
    try:
        return {f.path: max(len(e.chain()) - 1 for e in cat.extents(f.id)) for f in cat.files(model)}
    finally:
        cat.close()


def store_bytes(store: StorePaths) -> int:
    return sum(p.stat().st_size for p in (store.root / "packs").iterdir())


def test_a_later_release_in_the_same_directory_is_coded_against_the_earlier_one(tmp_path):
    src = releases(tmp_path / "src", 2)
    together, alone = StorePaths(tmp_path / "together"), StorePaths(tmp_path / "alone")
    r = add_model(together, src, "m")
    add_model(alone, src, "m", delta=False)
    assert served_digests(together) == served_digests(alone) == originals(src, "m")
    assert chunk_depths(together, "m") == {"model-v0.safetensors": 0, "model-v1.safetensors": 1}
    assert r.siblings.chunks > 0 and r.siblings.bytes_after < r.siblings.bytes_alone
    assert store_bytes(together) < store_bytes(alone) - (r.siblings.bytes_alone - r.siblings.bytes_after) * 0.9
    assert verify_store(together).ok


def test_no_chain_within_a_directory_grows_past_the_depth_cap(tmp_path):
    src = releases(tmp_path / "src", 4)
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "m", chain_depth=2)
    assert chunk_depths(store, "m") == {"model-v0.safetensors": 0, "model-v1.safetensors": 1,
                                        "model-v2.safetensors": 2, "model-v3.safetensors": 0}
    assert served_digests(store) == originals(src, "m")


def test_lmz_add_says_what_the_deltas_within_the_model_saved(tmp_path, capsys):
    src = releases(tmp_path / "src", 2)
    assert lmz(["--store", str(tmp_path / "store"), "add", str(src), "--name", "m"]) == 0
    out = capsys.readouterr().out
    assert "deltas within the model: " in out and "coded against the same tensor of an earlier file" in out


def test_no_delta_codes_every_file_of_the_directory_alone(tmp_path):
    src = releases(tmp_path / "src", 2)
    store = StorePaths(tmp_path / "store")
    r = add_model(store, src, "m", delta=False)
    assert r.siblings.chunks == 0
    assert chunk_depths(store, "m") == {"model-v0.safetensors": 0, "model-v1.safetensors": 0}


def test_removing_the_model_and_collecting_leaves_no_chunk_behind(tmp_path):
    src = releases(tmp_path / "src", 3)
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "m")
    add_model(store, releases(tmp_path / "other", 1, seed=9), "other")
    remove_models(store, ["m"])
    collect_garbage(store)
    cat = Catalog(store.catalog, readonly=True)
    try:
        assert cat.db.execute("SELECT COUNT(*) FROM chunks WHERE refs <= 0").fetchone()[0] == 0
        assert cat.db.execute("SELECT COUNT(*) FROM chunks WHERE base IS NOT NULL").fetchone()[0] == 0
    finally:
        cat.close()
    assert served_digests(store) == originals(tmp_path / "other", "other")
    assert verify_store(store).ok


def test_a_second_model_chains_against_a_directory_of_releases_within_the_cap(tmp_path):
    first, second = releases(tmp_path / "a", 2, seed=1), releases(tmp_path / "b", 2, seed=1)
    # the second model: the same files one release on (a small drift of every tensor)
    from safetensors.numpy import load_file, save_file
    for p in sorted(second.iterdir()):
        t = load_file(str(p))
        t["w"] = (t["w"] + np.float16(1e-3)).astype(np.float16)
        save_file(t, str(p))
    store = StorePaths(tmp_path / "store")
    add_model(store, first, "run/a", chain_depth=1)
    add_model(store, second, "run/b", chain_depth=1)
    for model in ("run/a", "run/b"):
        assert max(chunk_depths(store, model).values()) <= 1
    assert served_digests(store) == {**originals(first, "run/a"), **originals(second, "run/b")}
    assert verify_store(store).ok


def test_the_later_release_reads_back_through_a_mount(tmp_path):
    src = releases(tmp_path / "src", 2)
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "m")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store.root):
        for p in sorted(src.iterdir()):
            assert (mnt / "m" / p.name).read_bytes() == p.read_bytes()


def test_a_reference_whose_file_changed_since_it_was_read_gives_the_chunk_coded_alone(tmp_path):
    rng = np.random.default_rng(5)
    data = rng.integers(-3, 3, 1 << 16, dtype=np.int8).tobytes()
    ref_file = tmp_path / "ref"
    ref_file.write_bytes(data)                      # identical bytes: the best possible reference
    hint = ChunkHint("I8", 1, 0, (256, 256))
    import os
    fd = os.open(ref_file, os.O_RDONLY)
    try:
        good = encode_against(EncodePolicy(), data, hint, SiblingRef(hashlib.sha256(data).digest(), fd, 0, len(data)))
        stale = encode_against(EncodePolicy(), data, hint,
                               SiblingRef(hashlib.sha256(b"what was read").digest(), fd, 0, len(data)))
    finally:
        os.close(fd)
    assert good.base == hashlib.sha256(data).digest()
    assert stale.base is None and stale.encoded == encode_chunk(data, hint)


def test_a_directory_of_more_releases_than_kept_open_reads_back_and_leaves_no_descriptor_open(tmp_path):
    from lmzfs.store.write.siblings import MAX_OPEN_FILES
    src = releases(tmp_path / "src", MAX_OPEN_FILES + 3, size=4096)
    store = StorePaths(tmp_path / "store")
    gc.collect()        # earlier tests' unreachable files close now, not during the add (fewer fds after)
    before = len(list(Path("/proc/self/fd").iterdir()))
    r = add_model(store, src, "m", chain_depth=15)
    assert len(list(Path("/proc/self/fd").iterdir())) == before
    assert r.siblings.chunks > 0
    assert served_digests(store) == originals(src, "m")
    assert max(chunk_depths(store, "m").values()) <= 15
