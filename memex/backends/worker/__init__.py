"""Worker processes of the subprocess and pool backends: the process itself (``_main``, run as
``python -m memex.backends.worker``), the caller's side of it (``_client``: start, requests,
door frames, death) and the wire between them (``_wire``: length-prefixed msgpack frames over a
Unix socket, file descriptors passed alongside)."""


__all__: list[str] = []
