"""Codec speed per core (issue 3), and beside the peers on one core."""
from __future__ import annotations

from summary import fmt, table


def codec_speed_md(cs: dict) -> list[str]:
    out = ["### Codec speed per core (issue 3)", ""]
    if cs.get("error"):
        return out + [f"n/a: {cs['error']}", ""]
    out += [f"`bench/codec_speed.py`: every {cs['every']}th chunk of each file as `lmz add` cuts and codes it "
            "(default codecs), timed in CPU seconds of one thread, best of "
            f"{cs['runs']} decode runs; MB of plain bytes. \"decode + read check\" is what the mount spends per "
            "chunk it serves (the XXH3-128 of the plain bytes; n/a in runs from before it had one); \"decode + "
            "SHA-256\" is the check of chunks stored before lmzfs kept read checksums and of `lmz verify`; "
            "\"scalar steps\" is the same decode with the compiled loop's scalar steps where the CPU runs its "
            "AVX-512 ones (n/a elsewhere, and in runs from before there were any); "
            "\"numpy loop\" is the same decode without the compiled tANS loop (every "
            f"{4 * cs['every']}th chunk). lmzip's and ZipNN's on one core follow the table (where measured).", ""]
    rows = []
    for name, r in cs["files"].items():
        by = r.get("plain_bytes_by_codec") or {}
        tot = sum(by.values()) or 1
        mix = ", ".join(f"{k} {100 * v / tot:.0f}%" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))
        rows.append([name, f"{r['sample_bytes'] / 1e6:.1f} MB ({r['sample_chunks']} chunks)", fmt(r["saved_pct"], 2),
                     fmt(r["encode_mbps"], 1), fmt(r["decode_mbps"], 0),
                     fmt(r["decode_read_mbps"], 0) if r.get("decode_read_mbps") else "n/a",
                     fmt(r["decode_verify_mbps"], 0),
                     fmt(r["scalar_steps_decode_mbps"], 0) if r.get("scalar_steps_decode_mbps") else "n/a",
                     fmt(r["numpy_decode_mbps"], 0), mix])
    out += table(["file", "sample", "saved %", "encode MB/s/core", "decode MB/s/core", "decode + read check",
                  "decode + SHA-256", "scalar steps decode", "numpy loop decode", "codecs (by plain bytes)"],
                 rows, "llrrrrrrrl")
    return out


def peer_speed_md(cs: dict, ps: dict) -> list[str]:
    """Our codec speed per core (from codec_speed) beside lmzip's and ZipNN's on one thread."""
    out = ["Beside the peers on one core (`bench/peer_speed.py`, best of "
           f"{ps['runs']} runs): lmzip's `compress -j 1` / `decompress -j 1`, CPU seconds of the whole "
           "process less those of `lmz --version` (start-up), so reading and writing the files is in "
           "them; ZipNN's API with `threads=1` on the bytes in memory. Ours: the figures above (the codecs "
           "alone; decode with the mount's read check). MB of the original file per CPU second.", ""]
    rows = []

    def peer(r: dict, key: str) -> str:
        return fmt(r[key], 0) if "error" not in r else "n/a"

    for name, p in ps["files"].items():
        ours = cs.get("files", {}).get(name, {})
        lz, zn = p.get("lmzip", {"error": "missing"}), p.get("zipnn", {"error": "missing"})
        rows.append([name, fmt(ours.get("encode_mbps"), 1) if ours else "n/a", peer(lz, "encode_mbps"),
                     peer(zn, "encode_mbps"),
                     fmt(ours.get("decode_read_mbps"), 0) if ours.get("decode_read_mbps") else "n/a",
                     peer(lz, "decode_mbps"), peer(zn, "decode_mbps")])
    out += table(["file", "lmzfs encode", "lmzip compress", "ZipNN compress", "lmzfs decode + read check",
                  "lmzip decompress", "ZipNN decompress"], rows, "lrrrrrr")
    errors = [f"{name} {tool}: {r['error']}" for name, p in ps["files"].items() for tool, r in p.items()
              if isinstance(r, dict) and "error" in r]
    if errors:
        out += ["n/a: " + "; ".join(errors), ""]
    return out


def section(res: dict) -> list[str]:
    if not res.get("codec_speed"):
        return []
    out = codec_speed_md(res["codec_speed"])
    if res.get("peer_speed"):
        out += peer_speed_md(res["codec_speed"], res["peer_speed"])
    return out
