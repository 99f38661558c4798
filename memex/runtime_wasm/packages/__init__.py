"""The packages room: guest packages resolved from package indexes without running anything
of theirs on the host (``_index``: the configured indexes, read bounded; ``_resolve``: which
wheels, from their metadata alone; ``_wheels``: each wheel checked from its zip directory and
unpacked). No public names: ``runtime_wasm/_packages.py`` is the face."""

__all__: list[str] = []
