"""The one authentication of every network front end (``memex serve``, ``memex mcp --http``,
the cluster's fronts): who a request speaks for, from the key it presents.

A principal's keys are kept only as ``sha256:<hex>`` of the key (``memex serve --hash-key``
prints one); a presented key is hashed and compared with every stored hash in constant time
(``hmac.compare_digest``, no early exit), so neither a match nor its position leaks through
timing. The ring of principals is replaced as a whole when its source changes (a config
file's stat, a cluster's published copy), and :meth:`KeyRing.generation` says when: a key
found valid at one generation stays valid until the next, so an open socket checks the
generation on each frame (a number) and looks its key up again only when it moved. A
rotation is therefore seen by the next frame on every open socket, not by a timer."""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from ..errors import ConfigError

__all__ = ["KeyRing", "Principal", "bearer_key", "check_key_hashes", "hash_key",
           "key_matches"]

_PREFIX = "sha256:"
_HEX = frozenset("0123456789abcdef")


def _digest(key: str) -> str:
    return _PREFIX + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def hash_key(key: str, *, min_length: int = 16) -> str:
    """The form a key is stored in: ``sha256:<64 hex digits>`` (a key shorter than
    ``min_length`` is refused: one a person typed is guessable)."""
    if not isinstance(key, str) or len(key) < max(1, min_length):
        raise ConfigError(f"an API key is a str of at least {max(1, min_length)} characters")
    return _digest(key)


def check_key_hashes(where: str, keys: Sequence[str]) -> None:
    """Refuse anything in ``keys`` that is not a stored hash (a key pasted in clear above
    all: it would sit in the file and never match)."""
    for k in keys:
        if not (isinstance(k, str) and k.startswith(_PREFIX) and len(k) == 71
                and set(k[7:]) <= _HEX):
            shown = k[:12] if isinstance(k, str) else type(k).__name__
            raise ConfigError(f"{where}: {shown!r}... is not sha256:<64 hex digits> "
                              "(store `memex serve --hash-key` output, never the key)")


def key_matches(stored: Sequence[str], key: str | None) -> bool:
    """Whether ``key`` hashes to one of ``stored`` (every hash compared, in constant time)."""
    if not key:
        return False
    presented = _digest(key)
    found = False
    for h in stored:
        found |= hmac.compare_digest(h, presented)
    return found


def bearer_key(authorization: str | bytes | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header's value (the scheme's case
    ignored, RFC 9110), else None; a key that is not ASCII is no key."""
    if not authorization:
        return None
    raw = authorization.encode("latin-1") if isinstance(authorization, str) else authorization
    if raw[:7].lower() != b"bearer ":
        return None
    try:
        key = raw[7:].strip(b" \t").decode("ascii")
    except UnicodeDecodeError:
        return None
    return key or None


class HasKeys(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def keys(self) -> Sequence[str]: ...


P = TypeVar("P", bound=HasKeys)


@dataclass(frozen=True, kw_only=True)
class Principal:
    """Whoever a front end serves: a name, and the hashes of the keys that speak for it.
    A serve tenant is one (``TenantConfig``), and so is each of ``memex mcp``'s tokens."""

    name: str
    keys: tuple[str, ...] = ()


class KeyRing(Generic[P]):
    """Principals by key. ``source``, when given, is a file to watch: on a lookup its stat is
    compared with the last one seen, and a change reads it with ``load``; a file that no
    longer loads keeps the last good principals and is reported through ``last_error``.
    One key listed for two principals is refused (a ConfigError)."""

    def __init__(self, principals: Mapping[str, P], *, source: Path | None = None,
                 load: Callable[[Path], Mapping[str, P]] | None = None) -> None:
        if source is not None and load is None:
            raise ConfigError("a KeyRing that watches a file needs its loader")
        self._lock = threading.Lock()
        self._principals = self._checked(principals)
        self._source, self._load = source, load
        self._stamp = self._stat()
        self._generation = 0  # how many times the principals were replaced
        self.last_error: str | None = None

    @staticmethod
    def _checked(principals: Mapping[str, P]) -> dict[str, P]:
        seen: dict[str, str] = {}
        for p in principals.values():
            for k in p.keys:
                if k in seen and seen[k] != p.name:
                    raise ConfigError(f"one key is listed for {seen[k]!r} and {p.name!r}")
                seen[k] = p.name
        return dict(principals)

    def replace(self, principals: Mapping[str, P]) -> None:
        """Serve ``principals`` from now on (the next frame of every open socket sees it)."""
        checked = self._checked(principals)
        with self._lock:
            self._principals = checked
            self._generation += 1
            self.last_error = None

    def _stat(self) -> tuple[int, int, int] | None:
        if self._source is None:
            return None
        try:
            st = self._source.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _refresh(self) -> None:
        if self._source is None or self._load is None:
            return
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return
        with self._lock:
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                principals = self._checked(self._load(self._source))
            except ConfigError as exc:
                self.last_error = str(exc)
                return
            self._principals = principals
            self._generation += 1
            self.last_error = None

    def reload_soon(self) -> None:
        """Read the watched file again at the next lookup, changed or not (SIGHUP). Only an
        assignment: safe in a signal handler, which may interrupt a lookup holding the
        lock."""
        self._stamp = None

    def principals(self) -> dict[str, P]:
        self._refresh()
        return dict(self._principals)

    def generation(self) -> int:
        """A number that changes whenever the principals are replaced: a key found valid at
        one generation is valid until the next (an open socket needs no hashing per frame,
        only this ``stat``)."""
        self._refresh()
        return self._generation

    def lookup(self, key: str | None) -> P | None:
        """The principal whose key this is, else None (every stored hash compared)."""
        if not key:
            return None
        self._refresh()
        presented = _digest(key)
        found = None
        for p in self._principals.values():
            for stored in p.keys:
                if hmac.compare_digest(stored, presented):
                    found = p
        return found

    def bearer(self, authorization: str | bytes | None) -> P | None:
        """The principal of an ``Authorization`` header's value."""
        return self.lookup(bearer_key(authorization))
