"""Typed host tools over the msgpack door (tool registry, schemas, guest stubs, egress)."""

__all__: list[str] = []
