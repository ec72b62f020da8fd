"""A store kept in object storage (S3 and S3-compatible engines; read-only over plain HTTP(S)).

`lmz push` uploads what the remote lacks and publishes a snapshot of the catalog; hosts mount the
remote lazily, fetching ranges of pack objects into a bounded on-disk cache, each checked before
it is served. objects.py talks to the engine, format.py names and encodes what lies there,
push.py and prune.py write it, snapshots.py and packs.py read it.
"""
