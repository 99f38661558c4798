"""Guest packages a tenant asks for, resolved on the server within what the operator allows
(``packages = [...]`` of its ``[tenants.NAME]`` table): a resolution is a shared resource, so
each tenant has at most one at a time and the machine ``parallel``, and nobody waits for one
(a busy tenant is answered 429, a busy machine 503, both with Retry-After)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

from ..backends.internal import Ledger
from ..errors import BackendBusy, ConfigError, NotGranted
from ..runtime_wasm import PackageSet, bundled_packages, resolve_packages
from ..runtime_wasm.internal import checked_requirements, find_artifacts

__all__ = ["PackageGate", "allowed_packages"]

RESOLVE_TIMEOUT = 120.0
"""Seconds one tenant's resolution may take on a server (the library's default is longer)."""


def allowed_packages(names: Iterable[str], where: str) -> frozenset[str] | None:
    """The project names an operator allows (canonical), None for ``["*"]`` (any)."""
    from packaging.utils import InvalidName, canonicalize_name

    names = list(names)
    if names == ["*"]:
        return None
    out = set()
    for n in names:
        try:
            out.add(str(canonicalize_name(n, validate=True)))
        except InvalidName:
            raise ConfigError(f"{where}: {n!r} is not a package name (or give [\"*\"] "
                              "alone for any)") from None
    return frozenset(out)


class PackageGate:
    """Resolves each tenant's requirements to pins (what a sandbox is then opened with)."""

    def __init__(self, parallel: int = 2, timeout: float = RESOLVE_TIMEOUT,
                 resolve: Callable[..., PackageSet] = resolve_packages,
                 ledger: Ledger | None = None) -> None:
        self._slots = threading.BoundedSemaphore(parallel)
        self._lock = threading.Lock()
        # a tenant's resolution in flight is kept in its account (the server's one ledger)
        self.ledger = ledger if ledger is not None else Ledger()
        self._timeout, self._resolve = timeout, resolve

    def pins(self, tenant: str, allowed: frozenset[str] | None, requirements: Sequence[str],
             max_bytes: int | None = None) -> tuple[str, ...]:
        """``requirements`` resolved to locked pins (``name==version --hash=sha256:...``),
        every wheel of them (dependencies too) one the tenant may have: checked on the
        resolved set before any wheel is fetched. NotGranted (403) for one it may not,
        PackageError (422) for one that cannot run in the guest or is larger than
        ``max_bytes`` unpacked (the session's disk cap), BackendBusy (429/503) while the
        tenant's or the server's resolutions are busy."""
        if not requirements:
            return ()
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name

        reqs = checked_requirements(requirements)
        bundled = bundled_packages(find_artifacts())  # in every guest: no one's to allow
        self._check(tenant, allowed, [n for r in reqs
                                      if (n := canonicalize_name(Requirement(r).name))
                                      not in bundled])
        acct = self.ledger.account(tenant)
        with self._lock:
            if acct.resolving:
                raise BackendBusy("queue_full", f"tenant {tenant!r} is already resolving "
                                  "packages; retry when that create is answered")
            acct.resolving = True
        try:
            if not self._slots.acquire(blocking=False):
                raise BackendBusy("no_room", "this server is resolving other tenants' "
                                  "packages; retry shortly")
            try:
                got = self._resolve(
                    list(reqs), timeout=self._timeout, max_bytes=max_bytes,
                    allow=lambda wheels: self._check(
                        tenant, allowed, [canonicalize_name(n) for n, _ in wheels],
                        needed=True))
            finally:
                self._slots.release()
        finally:
            with self._lock:
                acct.resolving = False
        self._check(tenant, allowed, [canonicalize_name(w.name) for w in got.wheels],
                    needed=True)
        return got.locked

    @staticmethod
    def _check(tenant: str, allowed: frozenset[str] | None, names: Iterable[str],
               needed: bool = False) -> None:
        if allowed is None:
            return
        refused = sorted(set(names) - allowed)
        if refused:
            what = "needs" if needed else "asks for"
            raise NotGranted(f"tenant {tenant!r} {what} {', '.join(refused)}, which its "
                              f"operator does not allow (allowed: "
                              f"{', '.join(sorted(allowed)) or 'none'})")
