"""The front ends' one authentication (memex.serving.KeyRing): keys kept only as hashes, a
presented key matched against every one, a file's change seen by the next lookup, and the
generation that tells an open socket when to look its key up again."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memex.errors import ConfigError
from memex.serving import (
    KeyRing,
    Principal,
    bearer_key,
    check_key_hashes,
    hash_key,
    key_matches,
)

A, B = "a-key-of-sixteen-chars", "b-key-of-sixteen-chars"


def ring_of(**keys: str) -> KeyRing[Principal]:
    return KeyRing({n: Principal(name=n, keys=(hash_key(k),)) for n, k in keys.items()})


def test_a_key_finds_its_principal_and_nothing_else_does() -> None:
    ring = ring_of(a=A, b=B)
    assert ring.lookup(A) is not None and ring.lookup(A).name == "a"  # type: ignore[union-attr]
    assert ring.lookup(B).name == "b"  # type: ignore[union-attr]
    for wrong in (None, "", A + "x", A[:-1], hash_key(A)):  # a stored hash is no key
        assert ring.lookup(wrong) is None


def test_keys_are_kept_only_as_hashes() -> None:
    stored = hash_key(A)
    assert stored.startswith("sha256:") and A not in stored and len(stored) == 71
    check_key_hashes("here", [stored])  # positive control
    with pytest.raises(ConfigError, match="never the key"):
        check_key_hashes("here", [A])
    with pytest.raises(ConfigError, match="at least 16"):
        hash_key("short")
    assert key_matches([hash_key(B), stored], A) and not key_matches([stored], B)


def test_one_key_for_two_principals_is_refused() -> None:
    same = hash_key(A)
    with pytest.raises(ConfigError, match="one key is listed for"):
        KeyRing({"a": Principal(name="a", keys=(same,)),
                 "b": Principal(name="b", keys=(same,))})
    ring = ring_of(a=A)
    with pytest.raises(ConfigError):
        ring.replace({"a": Principal(name="a", keys=(same,)),
                      "b": Principal(name="b", keys=(same,))})
    assert ring.lookup(A) is not None  # a refused replacement leaves the ring as it was


def test_a_replacement_moves_the_generation_and_takes_effect_at_once() -> None:
    ring = ring_of(a=A)
    g = ring.generation()
    assert ring.generation() == g  # nothing changed: the same number
    ring.replace({"a": Principal(name="a", keys=(hash_key(B),))})  # a rotated
    assert ring.generation() != g
    assert ring.lookup(A) is None and ring.lookup(B) is not None


def _load(path: Path) -> Mapping[str, Principal]:
    text = path.read_text()
    if not text.startswith("keys:"):
        raise ConfigError(f"{path}: not a key file")
    return {"a": Principal(name="a", keys=tuple(text[5:].split()))}


def test_a_watched_file_is_reread_when_it_changes_and_a_bad_one_keeps_the_last(
        tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text(f"keys:{hash_key(A)}")
    ring = KeyRing(_load(f), source=f, load=_load)
    g = ring.generation()
    assert ring.lookup(A) is not None
    f.write_text(f"keys:{hash_key(B)} ")  # rotated (another size: the stat differs)
    assert ring.lookup(A) is None and ring.lookup(B) is not None
    assert ring.generation() == g + 1 and ring.last_error is None
    f.write_text("garbage that does not load")
    assert ring.lookup(B) is not None  # the last good principals stay
    assert ring.last_error is not None and "not a key file" in ring.last_error
    os.utime(f)


def test_bearer_key_reads_the_header_as_rfc_9110_says() -> None:
    assert bearer_key(f"Bearer {A}") == A
    assert bearer_key(f"bearer {A}".encode()) == A  # the scheme's case is not significant
    for bad in (None, "", A, f"Basic {A}", "Bearer ", b"Bearer \xff\xfe"):
        assert bearer_key(bad) is None
    assert ring_of(a=A).bearer(f"BEARER {A}") is not None


@given(st.binary(max_size=80) | st.text(max_size=80))
def test_bearer_key_never_raises(raw: bytes | str) -> None:
    if isinstance(raw, str):
        try:
            raw.encode("latin-1")
        except UnicodeEncodeError:
            return  # a header value is latin-1 by the ASGI spec
    got = bearer_key(raw)
    assert got is None or (got.isascii() and got)
