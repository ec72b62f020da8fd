"""The memory and CPUs the mount's defaults are sized from, read from fake /proc and cgroup trees;
and the descriptor limit a daemon raises."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from lmzfs import hostresources as hr
from lmzfs.hostresources import (MAX_CACHE, MIN_CACHE, default_cache_size, memory_limit, open_descriptors,
                                 open_files_limit, usable_cpus)

GiB = 1 << 30


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def own(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "proc-self-cgroup"
    p.write_text(text)
    return p


def test_without_cgroup_limits_the_memory_is_the_ram(tmp_path):
    root = tree(tmp_path / "cg", {"svc/memory.max": "max\n", "memory/memory.limit_in_bytes": "9223372036854771712\n"})
    proc = own(tmp_path, "0::/svc\n4:memory:/\n")
    assert memory_limit(cgroup_root=root, proc_cgroup=proc, physical=24 * GiB) == 24 * GiB


def test_a_cgroup_v2_limit_on_the_group_or_any_group_above_it_bounds_the_memory(tmp_path):
    root = tree(tmp_path / "cg", {"system.slice/memory.max": "1073741824\n",
                                  "system.slice/lmzfs.service/memory.max": "max\n"})
    proc = own(tmp_path, "0::/system.slice/lmzfs.service\n")
    assert memory_limit(cgroup_root=root, proc_cgroup=proc, physical=24 * GiB) == GiB
    (root / "system.slice/lmzfs.service/memory.max").write_text("536870912\n")
    assert memory_limit(cgroup_root=root, proc_cgroup=proc, physical=24 * GiB) == GiB // 2


def test_a_container_whose_cgroup_path_is_not_in_its_mount_uses_the_mount_root(tmp_path):
    # with a cgroup namespace the path may be "/" or name a group the container's mount lacks
    root = tree(tmp_path / "cg", {"memory.max": "805306368\n", "memory/memory.limit_in_bytes": "402653184\n"})
    assert memory_limit(cgroup_root=root, proc_cgroup=own(tmp_path, "0::/\n"), physical=24 * GiB) == 768 << 20
    proc = own(tmp_path, "12:memory:/docker/0123abcd\n")
    assert memory_limit(cgroup_root=root, proc_cgroup=proc, physical=24 * GiB) == 384 << 20


def test_unreadable_or_malformed_cgroup_files_are_ignored_not_guessed_at(tmp_path):
    root = tree(tmp_path / "cg", {"svc/memory.max": "lots\n", "memory/svc/memory.limit_in_bytes": "-1\n"})
    (root / "memory.max").mkdir()                         # a directory where a file was expected
    proc = own(tmp_path, "garbage line\n0::/svc\n4:memory:/svc\n")
    assert memory_limit(cgroup_root=root, proc_cgroup=proc, physical=8 * GiB) == 8 * GiB
    assert memory_limit(cgroup_root=root, proc_cgroup=tmp_path / "absent", physical=8 * GiB) == 8 * GiB


def test_the_default_cache_is_an_eighth_of_the_memory_between_32_and_256_mib():
    assert default_cache_size(24 * GiB) == MAX_CACHE == 256 << 20
    assert default_cache_size(2 * GiB) == 256 << 20
    assert default_cache_size(GiB) == 128 << 20
    assert default_cache_size(512 << 20) == 64 << 20
    assert default_cache_size(128 << 20) == MIN_CACHE == 32 << 20


def test_a_host_whose_memory_cannot_be_read_gets_the_largest_default(monkeypatch):
    monkeypatch.setattr(hr, "memory_limit", lambda: None)
    assert default_cache_size() == MAX_CACHE


def test_usable_cpus_are_the_affinity_mask_less_a_cgroup_quota(tmp_path):
    root = tree(tmp_path / "cg", {"svc/cpu.max": "max 100000\n"})
    proc = own(tmp_path, "0::/svc\n")
    assert usable_cpus(cgroup_root=root, proc_cgroup=proc, affinity=8) == 8
    (root / "svc/cpu.max").write_text("150000 100000\n")          # 1.5 CPUs of time: 2 threads
    assert usable_cpus(cgroup_root=root, proc_cgroup=proc, affinity=8) == 2
    assert usable_cpus(cgroup_root=root, proc_cgroup=proc, affinity=1) == 1


def test_a_cgroup_v1_cpu_quota_counts_and_minus_one_means_none(tmp_path):
    root = tree(tmp_path / "cg", {"cpu/batch/cpu.cfs_quota_us": "300000\n", "cpu/batch/cpu.cfs_period_us": "100000\n"})
    assert usable_cpus(cgroup_root=root, proc_cgroup=own(tmp_path, "3:cpu,cpuacct:/batch\n"), affinity=16) == 3
    (root / "cpu/batch/cpu.cfs_quota_us").write_text("-1\n")
    assert usable_cpus(cgroup_root=root, proc_cgroup=own(tmp_path, "3:cpu,cpuacct:/batch\n"), affinity=16) == 16


@pytest.mark.parametrize("text", ["0 100000\n", "abc 100000\n", "100000 0\n", "1 2 3\n"])
def test_a_zero_or_malformed_cpu_quota_never_gives_zero_cpus(tmp_path, text):
    root = tree(tmp_path / "cg", {"svc/cpu.max": text})
    assert usable_cpus(cgroup_root=root, proc_cgroup=own(tmp_path, "0::/svc\n"), affinity=4) == 4


def test_this_host_reports_positive_readings():
    assert memory_limit() > 0 and hr.physical_memory() >= memory_limit()
    assert 1 <= usable_cpus() <= (__import__("os").cpu_count() or 1)
    assert MIN_CACHE <= default_cache_size() <= MAX_CACHE


def _memory_cgroup(limit: int) -> Path | None:
    """A new cgroup (v1 or v2) limited to `limit` bytes, or None where this host will not make one."""
    import uuid
    v1, v2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
    if v1.is_dir():
        group, knob = v1 / f"lmzfs-test-{uuid.uuid4().hex[:8]}", "memory.limit_in_bytes"
    elif "memory" in (hr._read(v2 / "cgroup.subtree_control") or "").split():
        group, knob = v2 / f"lmzfs-test-{uuid.uuid4().hex[:8]}", "memory.max"
    else:
        return None
    try:
        group.mkdir()
    except OSError:
        return None
    try:
        (group / knob).write_text(f"{limit}\n")
    except OSError:
        group.rmdir()
        return None
    return group


def test_a_mount_host_in_a_512_mib_cgroup_gets_a_64_mib_cache_by_default(tmp_path):
    """End to end: doctor, run inside a real memory cgroup, sees its limit and sizes the cache."""
    import json
    import subprocess
    import sys
    group = _memory_cgroup(512 << 20)
    if group is None:
        pytest.skip("this host does not let the tests make a memory cgroup (needs root and a writable hierarchy)")
    try:
        script = f'echo $$ > {group}/cgroup.procs && exec "$0" -m lmzfs --store "$1" doctor --json'
        r = subprocess.run(["sh", "-c", script, sys.executable, str(tmp_path / "no-store")],
                           capture_output=True, text=True, timeout=120)
        doc = json.loads(r.stdout)
    finally:
        group.rmdir()
    assert doc["host"]["memory_bytes"] == 512 << 20, r.stderr
    assert doc["settings"]["cache_size"] == {"value": 64 << 20, "source": "default"}


def _limits_after_raising(soft: int, hard: int) -> tuple[int, int, int]:
    """(what raise_open_files_limit returns, the soft and the hard limit after it) in a process
    started with these limits, as a shell's `ulimit -Sn SOFT -Hn HARD` starts one."""
    code = ("import resource; from lmzfs.hostresources import raise_open_files_limit; "
            "now = raise_open_files_limit(); print(now, *resource.getrlimit(resource.RLIMIT_NOFILE))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))).stdout
    return tuple(int(v) for v in out.split())


def test_a_daemon_started_with_a_shells_soft_descriptor_limit_raises_it_to_the_hard_limit():
    assert _limits_after_raising(1024, 4096) == (4096, 4096, 4096)


def test_a_descriptor_limit_already_at_its_ceiling_is_left_as_it_is():
    assert _limits_after_raising(1024, 1024) == (1024, 1024, 1024)


def test_the_descriptors_this_process_holds_are_counted_from_proc():
    before = open_descriptors()
    r, w = os.pipe()
    try:
        assert open_descriptors() == before + 2
    finally:
        os.close(r)
        os.close(w)
    assert open_descriptors() == before
    assert open_files_limit() == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
