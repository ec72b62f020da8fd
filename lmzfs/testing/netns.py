"""A shaped link for tests and the bench (issue 50): a private network namespace whose own loopback
is rate-limited by a token bucket (`tc ... tbf`), so that an S3 engine and its clients started
inside it (`ip netns exec NAME ...`) talk over 127.0.0.1 at a chosen rate, and nothing else on the
host shares or sees that link. Root only (ip netns, tc). With a port, only the traffic to and from
that port is shaped (and counted: port_bytes): an engine made of several servers on 127.0.0.1
(SeaweedFS's gateway, filer and volume server) keeps its own hops off the clients' link.

    with ShapedLink() as link:              # namespace made, its lo up, unshaped
        link.shape("1gbit", port=8333)      # tbf rate 1gbit burst 512kb latency 20ms, port 8333's traffic
        subprocess.run(link.argv(["python", "client.py"]))
        link.shape(None)                    # unshaped again

The exit path always kills whatever still runs in the namespace (every process there was started
through it) and deletes it, also when the body failed. A process already inside the namespace can
change its shaping itself with shape_lo(). FUSE mounts made inside stay in that process tree's mount
namespace (`ip netns exec` gives it one of its own): whoever reads a mount should run inside too.
netem is not needed (and not available on every kernel): a token bucket with a 20 ms queue bound
gives the rate, and a real link's queueing."""
from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

LATENCY = "20ms"


def available() -> str | None:
    """None if a shaped link can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if not any((Path(d) / tool).exists() for d in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin", "/sbin"]):
            return f"`{tool}` (iproute2) is not installed"
    return None


def burst_for(rate: str) -> str:
    """The token bucket's depth: 512 KiB at 1 Gbit/s (the figure issue 50 names), scaled with the
    rate above it (a bucket shallower than one timer tick's worth of bytes caps the rate below the
    one asked for), never below 512 KiB."""
    bits = parse_rate(rate)
    return f"{max(512, int(512 * bits / 1e9))}kb"


def parse_rate(rate: str) -> float:
    """'1gbit' -> 1e9 (bits per second); tc's decimal units."""
    r = rate.lower().strip()
    for unit, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if r.endswith(unit):
            return float(r[: -len(unit)]) * mult
    raise ValueError(f"a rate like 1gbit or 100mbit, not {rate!r}")


def _tc(argv: list[str], prefix: list[str]) -> None:
    subprocess.run([*prefix, "tc", *argv], check=True, capture_output=True, text=True, timeout=30)


def shape_lo(rate: str | None, prefix: list[str] = (), port: int | None = None) -> None:
    """Shape this network namespace's loopback to *rate* (None: unshaped). port: only the TCP
    traffic to and from that port goes through the token bucket (an htb root whose unclassified
    packets pass straight through, a class for the port's packets picked by two u32 filters, and
    the tbf under it), so that an engine's own hops between its servers on other ports of
    127.0.0.1 stay off the shaped link: the link is the one between the clients and the S3
    endpoint. prefix: e.g. `ip netns exec NAME` to shape another namespace's."""
    prefix = list(prefix)
    subprocess.run([*prefix, "tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True, timeout=30)
    tbf = ["tbf", "rate", rate, "burst", burst_for(rate), "latency", LATENCY] if rate else []
    if port is None:
        if tbf:
            _tc(["qdisc", "add", "dev", "lo", "root", *tbf], prefix)
        return
    _tc(["qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb"], prefix)        # default 0: unclassified pass
    _tc(["class", "add", "dev", "lo", "parent", "1:", "classid", "1:1", "htb", "rate", "400gbit",
         "quantum", "200000"], prefix)
    if tbf:         # unshaped (rate None): the class alone, still counting the port's bytes
        _tc(["qdisc", "add", "dev", "lo", "parent", "1:1", "handle", "10:", *tbf], prefix)
    for side in ("sport", "dport"):
        _tc(["filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
             "match", "ip", side, str(port), "0xffff", "flowid", "1:1"], prefix)


def port_bytes(prefix: list[str] = ()) -> int | None:
    """Bytes to and from the shaped port (shape_lo with a port, any rate or none) since it was set,
    both directions, headers included: its htb class's counter; None if there is no such class."""
    text = subprocess.run([*prefix, "tc", "-s", "class", "show", "dev", "lo"], capture_output=True, text=True,
                          timeout=30).stdout
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("class htb 1:1 "):
            for follow in lines[i + 1:i + 3]:
                parts = follow.split()
                if parts[:1] == ["Sent"]:
                    return int(parts[1])
    return None


def lo_bytes(prefix: list[str] = ()) -> int:
    """Bytes loopback has carried in this namespace (each packet once: its transmit counter), every
    port's."""
    if prefix:
        text = subprocess.run([*prefix, "cat", "/proc/net/dev"], check=True, capture_output=True, text=True,
                              timeout=30).stdout
    else:
        text = Path("/proc/net/dev").read_text()
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[8])         # receive: 8 fields, then transmit bytes
    raise RuntimeError("no lo in /proc/net/dev")


class ShapedLink:
    def __init__(self, name: str | None = None):
        self.name = name or f"lmz-link-{os.getpid()}-{random.randrange(1 << 16):04x}"
        self.rate: str | None = None
        self._made = False

    def argv(self, cmd: list) -> list[str]:
        """cmd run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *[str(c) for c in cmd]]

    def shape(self, rate: str | None, port: int | None = None) -> None:
        shape_lo(rate, ["ip", "netns", "exec", self.name], port)
        self.rate = rate

    def qdisc(self) -> str:
        return subprocess.run(self.argv(["tc", "qdisc", "show", "dev", "lo"]), capture_output=True, text=True,
                              timeout=30).stdout.strip()

    def lo_bytes(self) -> int:
        return lo_bytes(["ip", "netns", "exec", self.name])

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True, timeout=30).stdout
        return [int(p) for p in out.split()]

    def __enter__(self) -> "ShapedLink":
        reason = available()
        if reason:
            raise RuntimeError(f"no shaped link: {reason}")
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True, text=True, timeout=30)
        self._made = True
        try:
            subprocess.run(self.argv(["ip", "link", "set", "lo", "up"]), check=True, capture_output=True,
                           text=True, timeout=30)
            # a guard outside the namespace, in a session of its own: if this process is killed
            # outright (SIGKILL, where no exit path runs), it stops what is left and deletes the namespace
            subprocess.Popen([sys.executable, "-m", "lmzfs.testing.netns", "--guard", self.name, str(os.getpid())],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        except BaseException:
            self.close()
            raise
        return self

    def close(self, grace: float = 15.0) -> None:
        """Every process still in the namespace (all started through it) SIGTERM, then after `grace`
        seconds SIGKILL; then the namespace deleted."""
        if not self._made:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            left = self.pids()
            for pid in left:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while left and time.monotonic() < deadline:
                time.sleep(0.1)
                left = self.pids()
            if not left:
                break
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
        self._made = False

    def __exit__(self, *exc) -> None:
        self.close()


def exit_with_parent() -> None:
    """SIGTERM to this process when the process that started it dies (Linux PR_SET_PDEATHSIG), for a
    process run inside the namespace: its own exit path then stops what it started."""
    import ctypes
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)      # PR_SET_PDEATHSIG


def _guard(name: str, owner: int) -> int:
    """Wait while the namespace exists and its owner lives; if the owner dies first, clean up."""
    while Path("/run/netns", name).exists():
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            link = ShapedLink(name)
            link._made = True
            link.close()
            return 0
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--guard":
        raise SystemExit(_guard(sys.argv[2], int(sys.argv[3])))
    raise SystemExit("usage: python -m lmzfs.testing.netns --guard NAME OWNER_PID")
