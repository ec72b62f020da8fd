"""Running lmzfs as a service: the config file, systemd notify, the units, `lmz doctor`, `lmz stats`."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from lmzfs.cli import main as lmz
from lmzfs.codecs import kernels
from lmzfs.config import load_config, resolve
from lmzfs.hostresources import default_cache_size
from lmzfs.daemon.mount import is_mount_point
from lmzfs.daemon.notify import Notifier
from lmzfs.mountinfo import Mount
from lmzfs.store.add import add_model
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.testing.mount import mounted, unmount_and_stop
from lmzfs.testing.synthetic import small_model

REPO = Path(__file__).resolve().parents[2]
UNITS = {"system": REPO / "systemd" / "lmzfs.service", "user": REPO / "systemd" / "user" / "lmzfs.service",
         "remote": REPO / "systemd" / "lmzfs-remote.service"}
LMZ_BIN = Path(sys.executable).parent / "lmz"


@pytest.fixture
def config(tmp_path, monkeypatch):
    """write(text) -> a config file that $LMZ_CONFIG names."""
    def write(text: str) -> Path:
        path = tmp_path / "config.toml"
        path.write_text(text)
        monkeypatch.setenv("LMZ_CONFIG", str(path))
        return path
    monkeypatch.delenv("LMZ_STORE", raising=False)
    return write


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("service")
    store = root / "store"
    add_model(StorePaths(store), small_model(root / "src"), "m1")
    return store


@pytest.fixture
def fresh_store(tmp_path) -> StorePaths:
    store = StorePaths(tmp_path / "store")
    add_model(store, small_model(tmp_path / "src"), "m1")
    return store


@pytest.fixture
def mnt(tmp_path) -> Path:
    path = tmp_path / "mnt"
    path.mkdir()
    return path


def lmz_run(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmzfs", *args], capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})


def lmzfs_mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


# -- the config file --------------------------------------------------------------------------

def test_flags_beat_the_environment_which_beats_the_config_which_beats_the_defaults(config, tmp_path, monkeypatch):
    path = config('store = "/cfg/store"\nmountpoint = "/cfg/mnt"\ncache_size = "512M"\nworkers = 3\n'
                  'allow_other = true\nreadahead = false\nchain_depth = 2\nremote = "s3://bkt/pfx"\n'
                  'remote_endpoint = "http://127.0.0.1:9"\nremote_cache_dir = "/cfg/cache"\n'
                  'remote_cache_size = "2G"\nremote_poll = "1m"\nremote_timeout = 5\n')
    s = resolve()
    assert (s.store, s.mountpoint, s.cache_size, s.workers, s.allow_other, s.readahead, s.chain_depth) == \
        (Path("/cfg/store"), Path("/cfg/mnt"), 512 << 20, 3, True, False, 2)
    assert (s.remote, s.remote_endpoint, s.remote_cache_dir, s.remote_cache_size, s.remote_poll, s.remote_timeout) == \
        ("s3://bkt/pfx", "http://127.0.0.1:9", Path("/cfg/cache"), 2 << 30, 60.0, 5.0)
    assert set(s.sources.values()) == {"config"} and s.config_file == path
    monkeypatch.setenv("LMZ_STORE", "/env/store")
    s = resolve()
    assert s.store == Path("/env/store") and s.sources["store"] == "env"
    s = resolve(store="/flag/store", mountpoint="/flag/mnt", cache_size=1 << 20, workers=1, allow_other=False,
                readahead=True, chain_depth=3, remote="s3://flag/pfx", remote_cache_dir="/flag/cache",
                remote_cache_size=1 << 30, remote_poll=5.0)
    assert (s.remote, s.remote_cache_dir, s.remote_cache_size, s.remote_poll) == \
        ("s3://flag/pfx", Path("/flag/cache"), 1 << 30, 5.0)
    del s.sources["remote_endpoint"], s.sources["remote_timeout"]      # no flags: config files and units set them
    assert (s.store, s.mountpoint, s.cache_size, s.workers, s.allow_other, s.readahead, s.chain_depth) == \
        (Path("/flag/store"), Path("/flag/mnt"), 1 << 20, 1, False, True, 3)
    assert set(s.sources.values()) == {"flag"}
    config("")
    monkeypatch.delenv("LMZ_STORE")
    s = resolve()
    assert (s.store, s.mountpoint, s.cache_size, s.workers, s.allow_other, s.readahead) == \
        (Path.home() / ".local/share/lmzfs", None, default_cache_size(), None, False, True)
    assert set(s.sources.values()) == {"default"}


def test_the_default_cache_size_follows_the_memory_the_host_or_its_cgroup_allows(monkeypatch, tmp_path):
    monkeypatch.setattr("lmzfs.config.DEFAULT_CONFIG", tmp_path / "absent.toml")
    monkeypatch.delenv("LMZ_CONFIG", raising=False)
    monkeypatch.setattr("lmzfs.hostresources.memory_limit", lambda: 512 << 20)    # a small container
    s = resolve()
    assert s.cache_size == 64 << 20 and s.sources["cache_size"] == "default"
    assert resolve(cache_size=300 << 20).cache_size == 300 << 20                # a flag still wins


def test_a_missing_default_config_is_fine_but_a_missing_named_one_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv("LMZ_CONFIG")
    monkeypatch.setattr("lmzfs.config.DEFAULT_CONFIG", tmp_path / "absent.toml")
    assert load_config() == ({}, None)
    monkeypatch.setenv("LMZ_CONFIG", str(tmp_path / "named.toml"))
    with pytest.raises(StoreError, match=r"named\.toml: no such file"):
        load_config()


def test_cache_size_takes_bytes_or_a_size_string(config):
    for text, expected in (("4096", 4096), ('"4096"', 4096), ('"512M"', 512 << 20), ('"2G"', 2 << 30),
                           ('"1.5GiB"', 3 << 29), ('"64k"', 64 << 10), ("0", 0)):
        config(f"cache_size = {text}\n")
        assert resolve().cache_size == expected, text


@pytest.mark.parametrize("text, reason", [
    ("colour = 'blue'\n", "'colour': unknown key"),
    ("store = 5\n", "'store': must be a non-empty string"),
    ("store = 'relative/dir'\n", "'store': must be an absolute path"),
    ("mountpoint = ['/a']\n", "'mountpoint': must be a non-empty string"),
    ("cache_size = 'lots'\n", "'cache_size': not a size: 'lots'"),
    ("cache_size = true\n", "'cache_size': must be a number of bytes"),
    ("cache_size = 1.5\n", "'cache_size': must be a number of bytes"),
    ("cache_size = -1\n", "'cache_size': must not be negative"),
    ("workers = 0\n", "'workers': must be at least 1"),
    ("workers = '4'\n", "'workers': must be an integer"),
    ("workers = true\n", "'workers': must be an integer"),
    ("allow_other = 'yes'\n", "'allow_other': must be true or false"),
    ("readahead = 1\n", "'readahead': must be true or false"),
    ("decoder = 'thread'\n", "'decoder': removed: chunks are always decoded in threads"),
    ("store = \n", "not valid TOML"),
])
def test_each_bad_config_is_an_error_naming_the_file_the_key_and_the_reason(config, text, reason):
    path = config(text)
    with pytest.raises(StoreError) as info:
        resolve()
    assert str(path) in str(info.value) and reason in str(info.value)


def test_a_bad_config_makes_lmz_print_one_line_and_exit_2(config, small_store, capsys):
    config("workers = 0\n")
    for argv in (["ls"], ["mount", "/nowhere"], ["umount"], ["stats"]):
        assert lmz(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "'workers': must be at least 1" in err
    # A command whose settings all come from flags does not need the config.
    assert lmz(["--store", str(small_store), "ls", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["model"] == "m1"


def test_every_command_uses_the_configs_store_unless_a_flag_or_lmz_store_names_one(config, small_store, tmp_path,
                                                                                     monkeypatch, capsys):
    config(f'store = "{small_store}"\n')
    assert lmz(["ls", "--json"]) == 0
    assert [m["model"] for m in json.loads(capsys.readouterr().out)] == ["m1"]
    monkeypatch.setenv("LMZ_STORE", str(tmp_path / "other"))
    assert lmz(["ls", "--json"]) == 0 and json.loads(capsys.readouterr().out) == []
    monkeypatch.delenv("LMZ_STORE")
    assert lmz(["--store", str(tmp_path / "other"), "ls", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_mount_and_umount_without_a_mountpoint_need_one_in_the_config(config, capsys):
    config("")
    for argv in (["mount"], ["umount"]):
        assert lmz(argv) == 2
        err = capsys.readouterr().err
        assert "no MOUNTPOINT given" in err and err.count("\n") == 1
    assert lmz_run("mount", "--workers", "0").returncode == 2


@pytest.mark.mount
def test_lmz_mount_and_umount_take_store_mountpoint_cache_size_and_readahead_from_the_config(config, small_store, mnt):
    path = config(f'store = "{small_store}"\nmountpoint = "{mnt}"\ncache_size = "3M"\nreadahead = false\n')
    env = {"LMZ_CONFIG": str(path)}
    try:
        r = lmz_run("mount", env=env)
        assert r.returncode == 0, r.stderr
        assert (mnt / "m1" / "config.json").read_text().startswith("{")
        stats = json.loads(lmz_run("stats", "--json", env=env).stdout)
        assert stats["cache"]["capacity_bytes"] == 3 << 20
        assert stats["readahead"]["enabled"] is False
        r = lmz_run("umount", env=env)
        assert r.returncode == 0, r.stderr
        assert not is_mount_point(mnt)
        # The flag beats the config: read-ahead back on.
        assert lmz_run("mount", "--readahead", env=env).returncode == 0
        assert json.loads((mnt / ".lmzfs" / "stats.json").read_text())["readahead"]["enabled"] is True
        assert lmz_run("umount", str(mnt), env=env).returncode == 0
    finally:
        unmount_and_stop(mnt)
    assert not lmzfs_mounted(mnt)


def test_the_example_config_is_valid_and_names_the_store_and_mountpoint_of_the_system_unit():
    values, _ = load_config(REPO / "systemd" / "config.toml.example")
    assert values["store"] == Path("/var/lib/lmzfs") and values["mountpoint"] == Path("/srv/models")
    assert "StateDirectory=lmzfs" in UNITS["system"].read_text()


# -- the systemd units --------------------------------------------------------------------------

def unit_settings(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.mark.parametrize("kind", ["system", "user", "remote"])
def test_systemd_analyze_verify_passes_on_the_unit(kind, tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt install systemd); CI installs it")
    # /usr/local/bin/lmz does not exist here, and verify checks that every command does.
    unit = tmp_path / UNITS[kind].name
    unit.write_text(UNITS[kind].read_text().replace("/usr/local/bin/lmz", str(LMZ_BIN)))
    runtime = tmp_path / "xdg"           # --user needs a runtime directory, even offline
    runtime.mkdir(mode=0o700)
    argv = [analyze, *(["--user"] if kind == "user" else []), "verify", str(unit)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_PAGER": ""})
    complaints = [line for line in (r.stdout + r.stderr).splitlines() if UNITS[kind].name in line]
    assert r.returncode == 0 and not complaints, r.stdout + r.stderr


def test_the_system_unit_keeps_the_hosts_mount_namespace_and_dev_fuse():
    s = unit_settings(UNITS["system"])
    namespaced = {"PrivateMounts", "PrivateDevices", "PrivateTmp", "PrivateNetwork", "PrivateIPC", "PrivateUsers",
                  "ProtectSystem", "ProtectHome", "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
                  "ProtectControlGroups", "ProtectProc", "ProcSubset", "ReadOnlyPaths", "ReadWritePaths",
                  "InaccessiblePaths", "BindPaths", "BindReadOnlyPaths", "TemporaryFileSystem", "RootDirectory",
                  "RootImage", "MountFlags", "DynamicUser"}
    assert not namespaced & s.keys()
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["ExecStart"] == ["/usr/local/bin/lmz mount --foreground"]
    assert [e.lstrip("-") for e in s["ExecStop"]] == ["/usr/local/bin/lmz umount"]
    assert s["DevicePolicy"] == ["closed"] and s["DeviceAllow"] == ["/dev/fuse rw"]
    assert "CAP_SYS_ADMIN" in s["CapabilityBoundingSet"][0].split()
    assert s["NoNewPrivileges"] == ["yes"] and s["Restart"] == ["on-failure"] and "TimeoutStopSec" in s


def test_the_remote_unit_reaches_the_network_and_takes_credentials_from_a_file_only():
    s = unit_settings(UNITS["remote"])
    assert s["ExecStart"] == ["/usr/local/bin/lmz mount --foreground"]      # the remote comes from the config
    assert s["EnvironmentFile"] == ["-/etc/lmzfs/remote.env"]
    assert not any("AWS_" in v for v in s.get("Environment", []))
    assert set(s["RestrictAddressFamilies"][0].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert s["CacheDirectory"] == ["lmzfs"] and s["Type"] == ["notify"]
    assert s["DeviceAllow"] == ["/dev/fuse rw"] and "CAP_SYS_ADMIN" in s["CapabilityBoundingSet"][0].split()
    values, _ = load_config(REPO / "systemd" / "config.toml.example")
    assert "remote" not in values        # commented out: the shipped config serves the local store


def test_the_user_unit_creates_its_mountpoint_and_lets_fusermount3_gain_privileges():
    s = unit_settings(UNITS["user"])
    assert s["Type"] == ["notify"] and s["ExecStartPre"] == ["/bin/mkdir -p %h/models"]
    assert s["ExecStart"] == ["/usr/local/bin/lmz mount --foreground --store %h/.local/share/lmzfs %h/models"]
    # In a user manager each of these implies NoNewPrivileges=yes, and setuid fusermount3 then fails.
    assert not {"NoNewPrivileges", "SystemCallFilter", "RestrictAddressFamilies", "LockPersonality",
                "MemoryDenyWriteExecute", "RestrictRealtime", "RestrictSUIDSGID", "RestrictNamespaces",
                "SystemCallArchitectures", "ProtectClock", "CapabilityBoundingSet", "PrivateDevices"} & s.keys()


# -- the notify protocol ------------------------------------------------------------------------

class NotifySocket:
    """A stand-in for systemd's notify socket: a bound AF_UNIX datagram socket."""

    def __init__(self, address: str):
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)

    def receive(self, timeout: float = 30.0) -> dict[str, str]:
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.splitlines())

    def nothing_within(self, timeout: float) -> bool:
        try:
            self.receive(timeout)
        except socket.timeout:
            return True
        return False

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket():
    # AF_UNIX paths are limited to 108 bytes: pytest's tmp_path can be too long.
    directory = tempfile.mkdtemp(prefix="lmzfs-notify-", dir="/tmp")
    sock = NotifySocket(os.path.join(directory, "notify"))
    yield sock
    sock.close()
    shutil.rmtree(directory)


@pytest.mark.mount
def test_a_foreground_mount_notifies_ready_with_a_status_then_stopping_on_sigterm(notify_socket, small_store, mnt):
    with mounted(mnt, small_store, env={"NOTIFY_SOCKET": notify_socket.address}) as fs:
        ready = notify_socket.receive()
        assert ready["READY"] == "1"
        assert ready["STATUS"] == f"serving 1 model from {small_store} at {mnt}"
        assert (mnt / "m1" / "config.json").exists()
        fs.process.send_signal(signal.SIGTERM)
        stopping = notify_socket.receive()
        assert stopping["STOPPING"] == "1"
        assert fs.process.wait(timeout=30) == 0
        assert not lmzfs_mounted(mnt)


@pytest.mark.mount
def test_the_status_follows_models_added_while_mounted(notify_socket, fresh_store, mnt, tmp_path):
    with mounted(mnt, fresh_store.root, env={"NOTIFY_SOCKET": notify_socket.address}):
        assert notify_socket.receive()["STATUS"].startswith("serving 1 model from")
        add_model(fresh_store, small_model(tmp_path / "src2", seed=1, mib=1), "fam/m2")
        assert notify_socket.receive(timeout=15) == {"STATUS": f"serving 2 models from {fresh_store.root} at {mnt}"}


@pytest.mark.mount
def test_the_abstract_socket_form_gets_ready_and_stopping_on_unmount(small_store, mnt):
    sock = NotifySocket(f"@lmzfs-test-{uuid.uuid4().hex}")
    try:
        with mounted(mnt, small_store, env={"NOTIFY_SOCKET": sock.address}) as fs:
            assert sock.receive()["READY"] == "1"
            r = lmz_run("umount", str(mnt))
            assert r.returncode == 0, r.stderr
            assert sock.receive()["STOPPING"] == "1"
            assert fs.process.wait(timeout=30) == 0
        assert not lmzfs_mounted(mnt)
    finally:
        sock.close()


@pytest.mark.mount
def test_lmz_mount_foreground_and_lmz_umount_behave_like_the_units_execstart_and_execstop(
        notify_socket, config, small_store, mnt):
    path = config(f'store = "{small_store}"\nmountpoint = "{mnt}"\n')
    env = {**os.environ, "LMZ_CONFIG": str(path), "NOTIFY_SOCKET": notify_socket.address}
    server = subprocess.Popen([sys.executable, "-m", "lmzfs", "mount", "--foreground"], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        ready = notify_socket.receive()
        assert ready["READY"] == "1" and ready["STATUS"].startswith("serving 1 model from")
        assert lmzfs_mounted(mnt)
        assert subprocess.run([sys.executable, "-m", "lmzfs", "umount"], env=env, timeout=60).returncode == 0
        assert notify_socket.receive()["STOPPING"] == "1"
        assert server.wait(timeout=30) == 0
        assert "INFO" in server.stdout.read().decode()        # its log went to stderr (the journal)
    finally:
        unmount_and_stop(mnt, server)
        server.stdout.close()
    assert not lmzfs_mounted(mnt)


@pytest.mark.mount
def test_the_background_launcher_never_claims_ready(notify_socket, small_store, mnt):
    try:
        r = lmz_run("--store", str(small_store), "mount", str(mnt), env={"NOTIFY_SOCKET": notify_socket.address})
        assert r.returncode == 0, r.stderr
        assert notify_socket.nothing_within(1.0)
    finally:
        unmount_and_stop(mnt)
    assert not lmzfs_mounted(mnt)


@pytest.mark.allow_log_warnings
def test_notify_is_a_no_op_without_a_socket_and_a_send_failure_is_logged_once_never_raised(
        monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not Notifier().enabled and Notifier().ready("x") is False
    broken = Notifier(str(tmp_path / "nobody-listens"))
    with caplog.at_level(logging.WARNING, logger="lmzfs.daemon.notify"):
        assert broken.ready("x") is False and broken.stopping() is False
    assert len([r for r in caplog.records if r.name == "lmzfs.daemon.notify"]) == 1


# -- lmz doctor -----------------------------------------------------------------------------------

@pytest.fixture
def no_other_mounts(monkeypatch):
    """Doctor sees only the lmzfs mounts of this test (other test runs may mount at the same time)."""
    from lmzfs import mountstats

    def only_mine(mine: Path | None = None):
        def lister(mountinfo: str = "/proc/self/mountinfo"):
            return [m for m in real(mountinfo) if mine is not None and m.mountpoint == mine]
        return lister
    real = mountstats.lmzfs_mounts
    monkeypatch.setattr("lmzfs.doctor.lmzfs_mounts", only_mine())
    return lambda mine: monkeypatch.setattr("lmzfs.doctor.lmzfs_mounts", only_mine(mine))


def doctor(capsys, store: Path, *extra: str) -> tuple[int, str]:
    status = lmz(["--store", str(store), "doctor", *extra])
    return status, capsys.readouterr().out


def test_doctor_on_a_healthy_store_exits_0_and_reports_versions_counts_and_settings(fresh_store, capsys,
                                                                                      no_other_mounts):
    status, out = doctor(capsys, fresh_store.root)
    assert status == 0, out
    assert "problem:" not in out and "healthy" in out and "pyfuse3" in out and "1 model(s), 2 file(s)" in out
    assert "catalog version 3" in out and "every chunk read is checked by its XXH3-128" in out
    assert re.search(r"^host +[0-9.]+ [KMGT]iB of RAM.*; \d+ usable CPU\(s\)$", out, re.M), out
    status, out = doctor(capsys, fresh_store.root, "--json")
    doc = json.loads(out)
    assert status == 0 and doc["ok"] and doc["problems"] == []
    assert doc["store"]["quick_check"] == "ok" and doc["store"]["models"] == 1 and doc["store"]["files"] == 2
    assert doc["store"]["catalog_version"] == "3" and doc["store"]["chunks_checked_by_sha256"] == 0
    assert doc["store"]["packs"] == {"referenced": 1, "missing": [], "damaged": []}
    assert doc["fuse"]["dev_fuse"]["openable"] and doc["versions"]["libfuse"]
    assert doc["versions"]["tans_decoder"] == "compiled"
    assert doc["versions"]["tans_steps"] == ("AVX-512" if kernels.compiled().vector_isa() == "avx512" else "scalar")
    assert doc["settings"]["store"] == {"value": str(fresh_store.root), "source": "flag"}
    assert doc["host"]["usable_cpus"] >= 1 and doc["host"]["memory_bytes"] > 0
    assert doc["settings"]["cache_size"] == {"value": default_cache_size(), "source": "default"}


def test_doctor_shows_the_default_worker_count(fresh_store, capsys, no_other_mounts):
    from lmzfs.hostresources import usable_cpus
    status, out = doctor(capsys, fresh_store.root)
    assert re.search(rf"^  workers +usable CPUs \({usable_cpus()}\) +\(default\)$", out, re.M), out


def test_doctor_names_a_deleted_pack_and_exits_1(fresh_store, capsys, no_other_mounts):
    pack = next(fresh_store.packs.glob("pack-*.lmzp"))
    pack.unlink()
    status, out = doctor(capsys, fresh_store.root)
    assert status == 1
    assert [line for line in out.splitlines() if line.startswith("problem:")] == \
        [f"problem: pack {pack} is missing (4 chunk(s) in the catalog are stored in it)"]


def test_doctor_names_a_damaged_pack_header_and_exits_1(fresh_store, capsys, no_other_mounts):
    pack = next(fresh_store.packs.glob("pack-*.lmzp"))
    with open(pack, "r+b") as f:
        f.write(b"garbage!")
    status, out = doctor(capsys, fresh_store.root)
    assert status == 1 and f"problem: pack {pack}: not an lmzfs pack file" in out


def test_doctor_names_a_garbage_catalog_and_exits_1(fresh_store, capsys, no_other_mounts):
    for extra in fresh_store.root.glob("catalog.sqlite-*"):
        extra.unlink()
    fresh_store.catalog.write_bytes(os.urandom(8192))
    status, out = doctor(capsys, fresh_store.root)
    problems = [line for line in out.splitlines() if line.startswith("problem:")]
    assert status == 1 and len(problems) == 1
    assert problems[0] == (f"problem: catalog {fresh_store.catalog} is damaged: run lmz verify --repair "
                           "(file is not a database)")


def test_doctor_wants_user_allow_other_in_fuse_conf_when_a_user_configures_allow_other(
        config, fresh_store, tmp_path, capsys, monkeypatch, no_other_mounts):
    config("allow_other = true\n")
    fuse_conf = tmp_path / "fuse.conf"
    fuse_conf.write_text("# user_allow_other\n")
    monkeypatch.setattr("lmzfs.doctor.FUSE_CONF", str(fuse_conf))
    monkeypatch.setattr("lmzfs.doctor.os.geteuid", lambda: 1000)
    status, out = doctor(capsys, fresh_store.root)
    assert status == 1 and f"problem: allow_other is configured but {fuse_conf} lacks a user_allow_other line" in out
    fuse_conf.write_text("user_allow_other\n")
    assert doctor(capsys, fresh_store.root)[0] == 0
    monkeypatch.setattr("lmzfs.doctor.os.geteuid", lambda: 0)     # root needs no fuse.conf line
    fuse_conf.unlink()
    assert doctor(capsys, fresh_store.root)[0] == 0


def test_doctor_names_a_missing_store_and_a_bad_config(config, tmp_path, capsys, no_other_mounts):
    config("cache_size = 'huge'\n")
    status, out = doctor(capsys, tmp_path / "nothing")
    problems = [line for line in out.splitlines() if line.startswith("problem:")]
    assert status == 1 and len(problems) == 2
    assert "'cache_size': not a size" in problems[0] and "no store at" in problems[1]


@pytest.mark.mount
def test_doctor_lists_an_active_mount_with_its_stats(small_store, mnt, capsys, no_other_mounts):
    with mounted(mnt, small_store):
        no_other_mounts(mnt)
        status, out = doctor(capsys, small_store, "--json")
        doc = json.loads(out)
        assert status == 0, doc["problems"]
        assert [m["mountpoint"] for m in doc["mounts"]] == [str(mnt)]
        assert doc["mounts"][0]["stats"]["pid"] > 0


@pytest.mark.mount
def test_doctor_names_a_mount_whose_server_died(small_store, mnt, capsys, no_other_mounts):
    with mounted(mnt, small_store) as fs:
        no_other_mounts(mnt)
        fs.process.kill()
        fs.process.wait()
        status, out = doctor(capsys, small_store)
        assert status == 1
        assert f"problem: mount {mnt} is not being served" in out and f"lmz umount {mnt}" in out
    assert not lmzfs_mounted(mnt)


# -- lmz stats ------------------------------------------------------------------------------------

@pytest.mark.mount
def test_lmz_stats_reports_bytes_served_equal_to_what_was_read(small_store, mnt, capsys, monkeypatch):
    from lmzfs import mountstats
    real = mountstats.lmzfs_mounts
    monkeypatch.setattr(mountstats, "lmzfs_mounts", lambda *a: [m for m in real(*a) if m.mountpoint == mnt])
    with mounted(mnt, small_store):
        read = sum(len((mnt / "m1" / name).read_bytes()) for name in ("config.json", "model.safetensors"))
        assert lmz(["stats", str(mnt), "--json"]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert stats["reader"]["bytes_served"] == read
        assert lmz(["stats"]) == 0                     # the only lmzfs mount
        out = capsys.readouterr().out
        assert f"lmzfs mount {mnt}" in out and f"({read} bytes)" in out and "cache       hit rate" in out
        assert "s of decoding" in out
        assert re.search(r"up \d+s\)", out)


def test_lmz_stats_asks_which_mount_when_there_are_several_or_none(monkeypatch, tmp_path, capsys):
    two = [Mount(tmp_path / "a", "0:50", "ro", "fuse.lmzfs", "lmzfs"), Mount(tmp_path / "b", "0:51", "ro", "fuse.lmzfs", "lmzfs")]
    monkeypatch.setattr("lmzfs.mountstats.lmzfs_mounts", lambda *a: two)
    assert lmz(["stats"]) == 2 and "several lmzfs mounts" in capsys.readouterr().err
    monkeypatch.setattr("lmzfs.mountstats.lmzfs_mounts", lambda *a: [])
    assert lmz(["stats"]) == 2 and "no lmzfs mount is active" in capsys.readouterr().err
    assert lmz(["stats", str(tmp_path)]) == 2 and "is not an lmzfs mount" in capsys.readouterr().err
