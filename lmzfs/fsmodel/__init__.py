"""The writable file system over a store, with no FUSE in it (the daemon adapts it to pyfuse3)."""
