"""`lmz doctor`'s remote section: can this host reach the remote store, what does it serve, how
are credentials found, and what does its cache hold. Names where credentials come from, never
what they are."""
from __future__ import annotations

import os
import time

from lmzfs.progress import human_bytes


def credential_source() -> str:
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        return "environment (AWS_ACCESS_KEY_ID)"
    try:
        import boto3
        creds = boto3.Session().get_credentials()
    except Exception:           # noqa: BLE001 -- a broken ~/.aws is reported as no credentials
        creds = None
    return f"boto3 chain ({creds.method})" if creds is not None else "none found (anonymous requests)"


def check_remote(options, problems: list[str]) -> dict:
    from lmzfs.reader.remotearchive import default_cache_dir
    from lmzfs.store.remote.blockcache import disk_bytes
    from lmzfs.store.remote.objects import ObjectStore, RemoteURL
    from lmzfs.store.remote.snapshots import read_pointer
    from lmzfs.store.layout import StoreError
    url = RemoteURL.parse(options.url)
    out: dict = {"url": str(url), "endpoint": options.endpoint or os.environ.get("AWS_ENDPOINT_URL"),
                 "credentials": credential_source() if url.scheme == "s3" else "none (plain HTTP(S))",
                 "cache_dir": str(options.cache_dir or default_cache_dir(url)), "reachable": False}
    cache = options.cache_dir or default_cache_dir(url)
    out["cache_bytes"] = disk_bytes(cache)
    out["cache_capacity_bytes"] = options.disk_cache_bytes
    t0 = time.monotonic()
    try:
        state = read_pointer(ObjectStore(url, endpoint=options.endpoint, timeout=min(options.timeout_s, 10.0)))
    except StoreError as exc:
        out["error"] = str(exc)
        problems.append(f"remote {url}: {exc}")
        return out
    out["reachable"] = True
    out["latency_ms"] = round(1000 * (time.monotonic() - t0), 1)
    if state.pointer is None:
        problems.append(f"remote {url}: nothing pushed there yet (lmz push {url} on the ingest host)")
        return out
    out["generation"] = state.pointer.generation
    out["published_age_s"] = round(time.time() - state.pointer.written, 1)
    return out


def render_remote(r: dict) -> list[str]:
    lines = [f"remote {r['url']}"]
    if r["reachable"]:
        state = f"reachable ({r['latency_ms']} ms)"
        if "generation" in r:
            state += f"; serving generation {r['generation']}, published {r['published_age_s']:.0f} s ago"
    else:
        state = f"UNREACHABLE: {r.get('error')}"
    lines.append(f"  state          {state}")
    lines.append(f"  endpoint       {r['endpoint'] or 'the provider default'}")
    lines.append(f"  credentials    {r['credentials']}")
    lines.append(f"  cache          {human_bytes(r['cache_bytes'])} of {human_bytes(r['cache_capacity_bytes'])} in "
                 f"{r['cache_dir']}")
    return lines
