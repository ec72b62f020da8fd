#!/usr/bin/env python3
"""`make bench`: compare.py with the mount reads on. Arguments pass through, e.g. --out docs/results.md."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(["--mount-read", *sys.argv[1:]]))
