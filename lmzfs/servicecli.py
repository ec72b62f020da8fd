"""The `lmz` commands a model host runs: mount and umount (with the config file's defaults),
doctor and stats. Argument parsing and output only; lmzfs/cli.py wires them in."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lmzfs.config import config_path, load_config, resolve
from lmzfs.remotecli import add_remote_option
from lmzfs.store.layout import StoreError


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_mount_arguments(sp: argparse.ArgumentParser, parse_size) -> None:
    sp.add_argument("mountpoint", nargs="?", help="where to serve the store (default: the config's mountpoint)")
    sp.add_argument("--foreground", "-f", action="store_true", help="stay in the foreground (for systemd and debugging)")
    sp.add_argument("--allow-other", action=argparse.BooleanOptionalAction, default=None,
                    help="let other users read the mount (needs user_allow_other in /etc/fuse.conf unless root)")
    sp.add_argument("--cache-size", type=parse_size, default=None, metavar="SIZE",
                    help="bytes of decoded chunks kept in memory (default: 1/8 of the usable memory, 32M to "
                         "256M); with --remote: bytes of fetched ranges kept on disk under --cache-dir (default "
                         "20G), as hf-mount's --cache-size")
    sp.add_argument("--workers", type=positive_int, default=None, help="parallel decodes (default: the usable CPUs)")
    sp.add_argument("--readahead", action=argparse.BooleanOptionalAction, default=None,
                    help="decode ahead of sequential readers (default: on)")
    from lmzfs.remotecli import add_mount_remote_arguments
    add_mount_remote_arguments(sp)
    sp.add_argument("--writable", action="store_true",
                    help="serve a writable file system: mkdir at the top makes a model, files written "
                         "into it are stored as `lmz add` stores them (docs/writable.md)")


def _no_mountpoint() -> StoreError:
    return StoreError(f"no MOUNTPOINT given, and the config ({config_path()[0]}) names none "
                      "(pass one, or set mountpoint = \"/path\" in the config)")


def cmd_mount(args) -> int:
    from lmzfs.daemon.mount import configure_logging, mount
    from lmzfs.remotecli import remote_options
    remote = remote_options(args, mount=True, disk_cache_bytes=args.cache_size)
    if remote is not None and args.writable:
        raise StoreError("a remote store is mounted read-only: --writable is for a local store")
    s = resolve(store=args.store, mountpoint=args.mountpoint, cache_size=None if remote else args.cache_size,
                workers=args.workers, allow_other=args.allow_other, readahead=args.readahead)
    if s.mountpoint is None:
        raise _no_mountpoint()
    if args.foreground:
        configure_logging()
    return mount(s.mountpoint, s.store, foreground=args.foreground, allow_other=s.allow_other,
                 cache_bytes=s.cache_size, workers=s.workers, readahead=s.readahead,
                 writable=getattr(args, "writable", False), remote=remote)


def cmd_umount(args) -> int:
    from lmzfs.daemon.mount import umount
    mountpoint = Path(args.mountpoint) if args.mountpoint else resolve().mountpoint
    if mountpoint is None:
        raise _no_mountpoint()
    return umount(mountpoint)


def cmd_doctor(args) -> int:
    from lmzfs.doctor import main_report
    config_error = None
    try:
        config, config_file = load_config()
    except StoreError as exc:               # reported as a problem; the rest is still checked
        config, config_file, config_error = {}, None, str(exc)
    settings = resolve(store=args.store, config=config, config_file=config_file)
    from lmzfs.remotecli import remote_options
    remote = remote_options(args, mount=config_error is None) if config_error is None or args.remote else None
    return main_report(settings, config_error, args.json, remote)


def cmd_stats(args) -> int:
    from lmzfs.mountstats import StatsUnavailable, is_lmzfs_mount, lmzfs_mounts, pick_mount, read_stats, summary
    from lmzfs.remotecli import print_lines, remote_options, remote_summary
    remote = remote_options(args)
    if remote is not None:
        if args.mountpoint:
            raise StoreError("give either a MOUNTPOINT or --remote, not both")
        print_lines(remote_summary(remote, as_json=args.json))
        return 0
    configured = None if args.mountpoint else resolve().mountpoint
    try:
        mountpoint = pick_mount(Path(args.mountpoint) if args.mountpoint else None, configured)
    except ValueError as exc:
        raise StoreError(str(exc)) from None
    if not is_lmzfs_mount(mountpoint):
        active = ", ".join(str(m.mountpoint) for m in lmzfs_mounts()) or "none"
        origin = "" if args.mountpoint else " (the config's mountpoint)"
        raise StoreError(f"{mountpoint}{origin} is not an lmzfs mount (active lmzfs mounts: {active})")
    try:
        text, stats = read_stats(mountpoint)
    except StatsUnavailable as exc:
        print(f"lmz: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        print("\n".join(summary(mountpoint, stats)))
    return 0


def add_commands(cmd) -> None:
    """Add `doctor` and `stats` through cli.build_parser's *cmd(name, func, help)*."""
    sp = cmd("doctor", cmd_doctor, "check FUSE, versions, the store's health, active mounts and settings; "
                                   "exit 1 if anything is broken")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    add_remote_option(sp, what="also check")
    sp = cmd("stats", cmd_stats, "what a running mount has served: bytes, decodes, cache, read-ahead (with "
                                 "--remote: what a remote store serves, and this host's cache of it)")
    sp.add_argument("mountpoint", nargs="?", help="default: the config's mountpoint, else the only lmzfs mount")
    sp.add_argument("--json", action="store_true", help="print the mount's raw stats.json")
    add_remote_option(sp, what="describe")
