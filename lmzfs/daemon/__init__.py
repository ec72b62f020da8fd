"""The FUSE daemon: serves the store read-only, byte for byte (see mount.py for the entry points)."""
