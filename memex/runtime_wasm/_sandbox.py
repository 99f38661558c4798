"""``Sandbox``: one live, capped CPython-on-WASI kernel whose state persists across turns and
survives traps (the failing turn is rolled back to the end of the last good one)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import (
    ConfigError,
    GuestStartError,
    ImageError,
    SandboxClosed,
    SandboxError,
)
from ._awake import AWAKE
from ._door import Door, serving_door
from ._handle import SandboxHandle
from ._instance import Instance, InstanceSpec, TurnOutcome
from ._output import OutputListener
from ._packages import GUEST_PACKAGES, PackageSet, hold_packages, resolve_packages
from ._protocol import fork_count
from ._records import GuestException, GuestFile, Limits, Mount, TurnResult, TurnStatus
from ._warm import warm_image, warm_image_named
from .engine._engine import LoadedModule, load_module
from .engine._files import (
    GUEST_BUNDLE,
    GUEST_LIB,
    bootstrap_source,
    bundle_dir,
    mpl_data_dir,
    stdlib_dir,
)
from .engine._runner import Runner
from .files import _hostfiles, _scratch, _tree
from .files._disk import DiskLedger, DiskPlace, DiskUse
from .images._dirty import TRACKER, MemoryWatch, Runs
from .images._image import MemoryImage
from .images._imagefile import read_image_file, write_image_file
from .packages._store import Held

__all__ = ["Checkpoint", "Sandbox"]

_TURN = "__memex_turn__()"
_LIVE: weakref.WeakSet[Sandbox] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
_REAPER: threading.Thread | None = None


class Checkpoint:
    """A saved guest state of one sandbox (an image of its memory), for ``restore``."""

    __slots__ = ("__weakref__", "_image", "_owner_key", "turns")

    def __init__(self, image: MemoryImage, owner_key: tuple[Any, ...], turns: int) -> None:
        self._image = image
        self._owner_key = owner_key
        self.turns = turns

    @property
    def size(self) -> int:
        return self._image.size


class Sandbox(SandboxHandle):
    """A persistent, capped Python kernel in WebAssembly.

    >>> with Sandbox(limits=Limits(timeout=5)) as sb:
    ...     sb.run("x = 21")
    ...     sb.run("x * 2").value
    '42'
    """

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        mounts: Sequence[Mount] = (),
        preload: Iterable[str] = (),
        door: Door | None = None,
        env: dict[str, str] | None = None,
        rollback: bool = True,
        packages: PackageSet | Sequence[str] | None = None,
        _image: MemoryImage | None = None,
        _scratch_from: Path | None = None,
        _family: Sandbox | None = None,
        _guard_files: bool = True,
    ) -> None:
        self.limits = limits or Limits()
        self.door = door if door is not None else Door()
        self.rollback = rollback
        self.preload = _checked_preload(preload)
        self.mounts = _checked_mounts(mounts)
        self._env = dict(env or {})
        self._closed_reason: str | None = None
        self._lock = threading.RLock()
        self._busy = False
        # the instance running a turn now (set on the runner thread), for interrupt()
        self._running: Instance | None = None
        self._running_lock = threading.Lock()
        # fork_many calls reading this sandbox's /tmp now; a close meanwhile leaves the
        # folder to the last of them to give back (else a new sandbox could take it while
        # children are still being cloned from it)
        self._forking = 0
        self._scratch_left: bool = False
        self._fork_lock = threading.Lock()
        self.turns = 0
        self.fuel_used_total = 0
        self.created = time.monotonic()
        self.last_used = self.created
        # Images of guest state. _good: the end of the last good turn (None: use _base, or a
        # fresh bootstrap when that is None too); while it is not frozen only this sandbox
        # holds it, so the next checkpoint may update it in place. _backing: the image mapped
        # copy-on-write under the live instance. _current: the live state equals _good (or
        # _base), so fork/checkpoint/save need no new copy. _ref: the image the live memory
        # equalled when _watch last looked, so the next image is _ref plus the pages written
        # since (None: the next image is a whole copy).
        self._good: MemoryImage | None = None
        self._base: MemoryImage | None = None
        self._backing: MemoryImage | None = None
        self._ref: MemoryImage | None = None
        self._watch: MemoryWatch | None = None
        self._current = False
        self._warm = False  # _base is a warm image (made without this sandbox's environment)
        self._inst: Instance | None = None
        self._asleep = False  # the instance was given up while idle (see _awake)
        self._loaded: LoadedModule = load_module("metered" if self.limits.metered else "plain")
        self.packages = _packages_of(packages, self._loaded, self.limits.disk_bytes)
        if self.packages is not None and self.packages.size > self.limits.disk_bytes:
            raise ConfigError(f"the packages take {self.packages.size} bytes unpacked, more "
                              f"than Limits.disk_bytes ({self.limits.disk_bytes})")
        self._held: Held | None = None
        if self.packages is not None:  # never evicted while mounted here (any process)
            self.packages, self._held = hold_packages(self.packages, self._loaded.artifacts)
        scratch, real = _scratch.take()
        self._scratch = Path(scratch)
        self._place = DiskPlace(root=real, scratch=True)
        self._disk = self._disk_of(_family, _scratch_from)
        self._spec = self._make_spec(_guard_files)
        self._runner = Runner(f"memex-sandbox-{id(self):x}")
        try:
            self._start(_image)
        except BaseException:
            self._shutdown("failed to start")
            raise
        with _LIVE_LOCK:
            _LIVE.add(self)
        if self.limits.idle_timeout is not None or self.limits.lifetime is not None:
            _start_reaper()

    # ---- construction -------------------------------------------------------------------
    def _disk_of(self, family: Sandbox | None, scratch_from: Path | None) -> DiskUse:
        """This sandbox's view of the disk ledger it counts against: its fork family's (a
        fork's /tmp shares the parent's files until either side writes to one), else a new
        one over its /tmp and writable mounts (with a copy of ``scratch_from`` in /tmp)."""
        dst = str(self._scratch)
        try:
            if family is not None:
                ledger = family._disk.ledger
                inst = family._inst
                writing = inst.files.writing_keys() if inst is not None else set()
                with ledger.lock:
                    _tree.clone(str(family._scratch), dst, limit=ledger.max_entries,
                                share=lambda st: (st.st_dev, st.st_ino) not in writing)
                    ledger.add_place(self._place)
                    ledger.members += 1
                    if ledger.bytes > ledger.max_bytes or ledger.entries > ledger.max_entries:
                        ledger.members -= 1
                        ledger.release_tree(self._place)
                        raise SandboxError(
                            "the fork would take its family past its disk quota "
                            f"(Limits.disk_bytes {ledger.max_bytes}, disk_files "
                            f"{ledger.max_entries}, shared by a sandbox and its forks)")
                return DiskUse(ledger)
            if scratch_from is not None:
                _tree.clone(str(scratch_from), dst, share=lambda st: False,
                            limit=self.limits.disk_files)
            ledger = DiskLedger(
                [self._place] + [DiskPlace(root=os.path.realpath(m.host_path), links=m.links)
                                 for m in self.mounts if m.writable],
                max_bytes=self.limits.disk_bytes, max_entries=self.limits.disk_files,
                max_open=self.limits.open_files)
            ledger.members = 1
            if self.packages is not None:  # installs count against the disk cap
                ledger.bytes += self.packages.size
            return DiskUse(ledger)
        except BaseException:
            _tree.remove(dst)
            raise

    def _start(self, image: MemoryImage | None) -> None:
        """The first instance: from ``image`` (a fork, restore or load), else from the warm
        image of its preload (shared copy-on-write by every sandbox of its kind after the
        first), else a fresh bootstrap."""
        # A warm image is keyed and built without the sandbox's own environment (the
        # runtime's base one only), so sandboxes that differ in an environment value share
        # one image rather than each leaving one in the cache; their values are set in the
        # guest after the image is restored (_apply_env). A preload's imports see the base
        # environment.
        warm_spec = self._warm_spec()
        self._warm = image is None
        if image is not None:
            self._base = image
        elif self.preload:
            self._base = warm_image(self._loaded, warm_spec, self.preload)
        else:
            self._base = warm_image(self._loaded, warm_spec, (), build=False)
            if self._base is None and _seen_before(self._key()):
                self._base = warm_image(self._loaded, warm_spec, ())
        if self._base is not None:
            self._base.freeze()  # shared with whoever handed it over
        self._runner.call(self._fresh_instance)

    def _make_spec(self, guard_files: bool) -> InstanceSpec:
        arts = self._loaded.artifacts
        preopens: list[tuple[str, str, bool]] = [
            (str(stdlib_dir(arts)), GUEST_LIB, False),
            (str(bundle_dir()), GUEST_BUNDLE, False),
        ]
        mpl = mpl_data_dir(arts)
        if mpl is not None:
            preopens.append(
                (str(mpl), f"{GUEST_LIB}/python{arts.python_tag}.zip/matplotlib/mpl-data", False)
            )
        preopens.append((str(self._scratch), "/tmp", True))
        if self.packages is not None:
            preopens.append((str(self.packages.root), GUEST_PACKAGES, False))
        for m in self.mounts:
            preopens.append((str(Path(m.host_path).resolve()), m.guest_path, m.writable))
        env = self._base_env()
        env.update(self._env)
        return InstanceSpec(
            preopens=tuple(preopens),
            env=tuple(sorted(env.items())),
            memory_limit=self.limits.memory,
            guard_files=guard_files,
        )

    def _base_env(self) -> dict[str, str]:
        """The environment every sandbox of this interpreter and package set starts with."""
        env = {
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": "/tmp/.matplotlib",
            "MSGPACK_PUREPYTHON": "1",
            "PYTHONIOENCODING": "utf-8",
        }
        if self.packages is not None:  # its own warm image: sys.path sees only its set
            env["MEMEX_PACKAGES"] = self.packages.id
        return env

    def _warm_spec(self) -> InstanceSpec:
        """The spec a warm image is keyed and built by: this one without the sandbox's own
        environment."""
        return dataclasses.replace(self._spec, env=tuple(sorted(self._base_env().items())))

    def _apply_env(self, inst: Instance) -> bool:
        """(runner) Set the sandbox's own environment in a guest restored from a warm image
        (built with the base one); whether there was any to set. A value that cannot be
        set is a GuestStartError."""
        base = self._base_env()
        extra = {k: v for k, v in self._spec.env if base.get(k) != v}
        if not extra:
            return False
        code = f"import os as _o\n_o.environ.update({extra!r})\ndel _o\n"
        out = inst.run_raw(code, deadline=time.monotonic() + 60, fuel=None, cell={})
        if out.trap or out.raw_rc:
            raise GuestStartError(f"setting the sandbox's environment failed: "
                                  f"{out.trap or inst.stderr.text()[-2000:]}")
        return True

    def _new_instance(self) -> Instance:
        door = self.door
        return Instance(self._loaded, self._spec, door.dispatch, self._disk,
                        frame_cap=lambda: door.max_request_bytes, too_large=door.too_large)

    def _fresh_instance(self) -> None:
        """(runner) Replace the instance by one holding the last good state."""
        old, self._inst = self._inst, None
        if old is not None:
            old.close()
        self._backing = self._ref = self._watch = None
        inst = self._new_instance()
        try:
            image = self._good if self._good is not None else self._base
            mapped: int | None = None
            applied = False
            if image is not None:
                mapped = image.restore_into(inst)
                self._backing = image
                if image is self._base and self._warm:
                    applied = self._apply_env(inst)
            else:
                self._bootstrap(inst)
        except BaseException:
            inst.close()
            raise
        self._inst = inst
        self._asleep = False
        # the live state is the image's, unless the sandbox's environment was set on it
        # (a fork, checkpoint or save then takes the live state, not the shared image)
        self._current = image is not None and not applied
        if image is not None:
            self._watch_from(inst, image, mapped=mapped)
        AWAKE.used(self)

    def _doze(self) -> None:
        """Queue giving the live instance up (see _awake), weakly: the queued job must not
        keep a dropped sandbox alive."""
        ref = weakref.WeakMethod(self._sleep)
        self._runner.post(lambda: (m := ref()) is not None and m())

    def _sleep(self) -> None:
        """(runner) Give the instance up, keeping the guest's state as its image, if it is
        idle and its guest holds no file open (a new instance would not have it open)."""
        inst = self._inst
        if inst is None or not inst.alive or self._closed_reason is not None or self._busy \
                or not self._spec.guard_files or inst.files.open_count:
            return
        if not self._current:
            self._checkpoint_good(last=True)
        if self._inst is not inst or not self._current:
            return
        self._inst = None
        self._backing = self._ref = self._watch = None
        self._asleep = True
        AWAKE.forget(self)
        inst.close()

    def _watch_from(self, inst: Instance, image: MemoryImage, *,
                    mapped: int | None = None) -> None:
        """(runner) From now on the next image of ``inst`` is ``image`` plus what it writes
        (when this host can track written pages); ``mapped``: see MemoryWatch."""
        self._ref, self._watch = None, None
        if TRACKER.mode != "off":
            watch = MemoryWatch(TRACKER, inst.memory_address(), inst.memory_size(),
                                mapped=mapped)
            if watch.active:
                self._ref, self._watch = image, watch

    def _written(self, inst: Instance, *, last: bool = False) -> Runs | None:
        """(runner) The pages written since ``_ref``, or None when they are not known
        (``last``: ``inst`` is let go right after; see MemoryWatch.take)."""
        if self._watch is None or self._ref is None:
            return None
        runs = self._watch.take(inst.memory_address(), inst.memory_size(), last=last)
        if runs is None:
            self._ref = self._watch = None
        elif self.turns == 1 and self._ref is self._base:
            self._ref.learn_hot(runs)  # what a first turn writes: prefaulted from now on
        return runs

    def _teach_base(self, inst: Instance) -> None:
        """(runner, closing) A sandbox closed after one turn (a churn loop never reaches a
        second) teaches its image what a first turn writes (MemoryImage.learn_hot); the
        scan is paid only while the image is learning, and never fails a close."""
        base = self._base
        if self.turns == 1 and base is not None and self._ref is base and base.learns_hot:
            with contextlib.suppress(Exception):
                self._written(inst, last=True)

    def _bootstrap(self, inst: Instance) -> None:
        out = inst.run_raw(bootstrap_source(), deadline=time.monotonic() + 60, fuel=None,
                           cell={})
        if out.trap or out.raw_rc:
            raise GuestStartError(
                f"guest bootstrap failed ({out.trap or f'rc={out.raw_rc}'}): "
                f"{inst.stderr.text()[-2000:]}"
            )

    # ---- state --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed_reason is not None:
            raise SandboxClosed(self._closed_reason)

    @property
    def memory_bytes(self) -> int:
        self._check_open()
        return self._runner.call(self._memory_size)

    def _memory_size(self) -> int:
        if self._asleep and self._good is not None:
            return self._good.size  # no need to wake it
        return self._require().memory_size()

    def _require(self) -> Instance:
        """(runner) The live instance; a sleeping sandbox gets a new one on its image."""
        if self._inst is None:
            if self._asleep and self._closed_reason is None:
                self._fresh_instance()
                if self._inst is not None:
                    return self._inst
            raise SandboxClosed(self._closed_reason or "guest lost")
        return self._inst

    def _key(self) -> tuple[Any, ...]:
        return (self._loaded.flavour, tuple((g, w) for _, g, w in self._spec.preopens),
                self._warm_spec().env)

    # ---- turns --------------------------------------------------------------------------
    def run(self, code: str, *, timeout: float | None = None, filename: str | None = None,
            on_output: OutputListener | None = None) -> TurnResult:
        """Run one cell. Guest errors, exits and limits come back as data in the result.
        ``on_output(stream, text)`` hears stdout/stderr as the guest writes them (what the
        result will hold, up to the caps), on the sandbox's own thread: keep it quick."""
        if not isinstance(code, str):
            raise ConfigError(f"code must be a str, got {type(code).__name__}")
        if timeout is not None and not (0 < timeout < float("inf")):
            raise ConfigError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        if serving_door() is self.door:
            raise SandboxError(
                "a door handler cannot run code in the sandbox whose turn is waiting for it"
            )
        with self._lock:
            self._check_open()
            self._busy = True
            try:
                return self._runner.call(lambda: self._turn(code, timeout, filename, on_output))
            finally:
                self._busy = False
                self.last_used = time.monotonic()

    def _turn(self, code: str, timeout: float | None, filename: str | None,
              on_output: OutputListener | None = None) -> TurnResult:
        inst = self._require()
        AWAKE.used(self)  # the most recently used: the last to be put to sleep
        if self.rollback and not self._current:
            # The state this turn may roll back to, taken now rather than after the last
            # turn: an idle sandbox then holds its written pages once (not also a copy),
            # and one closed after its last turn never pays for the copy.
            self._checkpoint_good()
        lim = self.limits
        start = time.monotonic()
        # Limits.timeout is a hard cap: a per-turn timeout may only shorten it.
        budget = lim.timeout if timeout is None else min(timeout, lim.timeout)
        lifetime_cut = False
        if lim.lifetime is not None:
            left = self.created + lim.lifetime - start
            if left < budget:
                budget, lifetime_cut = max(left, 0.001), True
        fuel: int | None = lim.fuel
        fuel_total_cut = False
        if lim.fuel_total is not None:
            left_fuel = max(lim.fuel_total - self.fuel_used_total, 1)
            if fuel is None or left_fuel < fuel:
                fuel, fuel_total_cut = left_fuel, True
        inst.stdout.reset(lim.stdout_bytes, on_output)
        inst.stderr.reset(lim.stderr_bytes, on_output)
        self.turns += 1
        self._current = False
        self._disk.take_hit()
        cell: dict[str, object] = {"code": code, "filename": filename or f"<cell-{self.turns}>"}
        with self._running_lock:
            self._running = inst
        try:
            out = inst.run_raw(_TURN, deadline=start + budget, fuel=fuel, cell=cell,
                               said=budget)
        finally:
            inst.stdout.finish()
            inst.stderr.finish()
            with self._running_lock:
                self._running = None
                if inst.cancel_detail is not None:  # an interrupt that came too late
                    inst.cancel_detail = None
                    if self._closed_reason is None:
                        inst.cancel.clear()
        duration = time.monotonic() - start
        if out.fuel_used is not None:
            self.fuel_used_total += out.fuel_used
        limit = out.limit
        disk_hit = self._disk.take_hit()
        if limit == "deadline" and lifetime_cut:
            limit = "lifetime"
        if limit == "fuel" and fuel_total_cut:
            limit = "fuel_total"
        truncated = tuple(s.name for s in (inst.stdout, inst.stderr) if s.truncated)
        stdout, stderr = inst.stdout.text(), inst.stderr.text()
        if out.trap is not None:
            # A sandbox being closed is not worth restoring.
            rolled_back = self._recover() if self._closed_reason is None else False
            return TurnResult(
                status=TurnStatus.EXIT if limit == "exit" else TurnStatus.KILLED,
                stdout=stdout, stderr=stderr, limit=limit, trap=out.trap,
                exit_code=out.exit_code, rolled_back=rolled_back, duration=duration,
                fuel_used=out.fuel_used, truncated=truncated,
                memory_bytes=self._inst.memory_size() if self._inst else 0,
                disk_bytes=self._disk.bytes, disk_files=self._disk.entries,
            )
        return self._from_report(out, stdout, stderr, duration, truncated, inst, disk_hit)

    def interrupt(self) -> bool:
        """Stop the turn running now, from another thread or a signal handler (``memex repl``
        maps Ctrl-C to it). The turn ends ``killed`` with ``limit="cancelled"`` within a few
        tens of milliseconds and the guest is rolled back to the end of the last good turn, as
        after any trap; the sandbox stays open. False when no turn was running."""
        with self._running_lock:
            inst = self._running
            if inst is None or self._closed_reason is not None:
                return False
            inst.cancel_detail = "turn interrupted (Sandbox.interrupt)"
            inst.cancel.set()
            return True

    def _from_report(self, out: TurnOutcome, stdout: str, stderr: str, duration: float,
                     truncated: tuple[str, ...], inst: Instance, disk_hit: str | None
                     ) -> TurnResult:
        rep = out.report
        common: dict[str, Any] = dict(stdout=stdout, stderr=stderr, duration=duration,
                                      fuel_used=out.fuel_used, truncated=truncated,
                                      memory_bytes=inst.memory_size(),
                                      disk_bytes=self._disk.bytes, disk_files=self._disk.entries)
        if not isinstance(rep, dict):
            return TurnResult(
                status=TurnStatus.ERROR, limit=disk_hit,
                exception=GuestException(type="MemexDriverError",
                                         message=f"the guest's turn driver did not report "
                                         f"(rc={out.raw_rc})", traceback=stderr[-4000:]),
                **common,
            )
        status = rep.get("status")
        if status == "ok":
            value = rep.get("value")
            return TurnResult(status=TurnStatus.OK, value=value if isinstance(value, str) else None,
                              limit=disk_hit, **common)
        if status == "exit":
            code = rep.get("exit_code")
            return TurnResult(status=TurnStatus.EXIT, limit=disk_hit,
                              exit_code=code if isinstance(code, int) else 1, **common)
        exc = rep.get("exception") if isinstance(rep.get("exception"), dict) else {}
        assert isinstance(exc, dict)
        etype = str(exc.get("type", "Exception"))
        return TurnResult(
            status=TurnStatus.ERROR,
            exception=GuestException(type=etype, message=str(exc.get("message", "")),
                                     traceback=str(exc.get("traceback", ""))),
            limit="memory" if etype == "MemoryError" else disk_hit,
            **common,
        )

    def _checkpoint_good(self, *, last: bool = False) -> None:
        """(runner) Remember the live state, the end of the last good turn, for rollback (at
        the start of the next turn, or when a checkpoint, fork or save needs it; ``last``:
        before the instance is let go, so nothing need watch it afterwards)."""
        inst = self._inst
        if inst is None or not inst.alive:
            return
        good = self._good
        if good is not None and not good.frozen:
            if good is self._ref:  # only what the turn wrote, into the image itself
                runs = self._written(inst, last=last)
                if runs is not None:
                    self._good = self._ref = good.update(inst, runs)
                    self._current = True
                    return
            elif self._watch is None and not good.is_delta and good is not self._backing:
                good.overwrite_from(inst)  # untracked: a whole copy, into its own pages
                self._watch_from(inst, good)
                self._current = True
                return
        self._good = self._image_of_now(inst, last=last)
        self._current = True

    def _image_of_now(self, inst: Instance, *, last: bool = False) -> MemoryImage:
        """(runner) A new image of the live memory: a delta on ``_ref`` when the watch knows
        what was written since, else a whole copy (watched from then on, unless ``last``)."""
        runs = self._written(inst, last=last)
        if runs is not None and self._ref is not None:
            image = self._ref.derive(inst, runs)
            self._ref = image
        else:
            image = MemoryImage.capture(inst)
            if not last:
                self._watch_from(inst, image)
        return image

    def _shared_image(self) -> MemoryImage:
        """(runner) An immutable image of the live state for a checkpoint, fork or save: the
        rollback image when it is current (no copy), else a new one."""
        if self._current:
            image = self._good if self._good is not None else self._base
            if image is not None:
                image.freeze()  # someone else holds it from now on
                return image
        image = self._image_of_now(self._require())
        image.freeze()
        if self.rollback:  # it is also the state to roll back to
            self._good, self._current = image, True
        return image

    def _recover(self) -> bool:
        """(runner) After a trap: a new instance holding the last good state."""
        if not self.rollback:
            self._good = None  # start over from the base state
        try:
            self._fresh_instance()
        except Exception as exc:
            self._shutdown(f"guest could not be restored after a trap: {exc}")
            return False
        return self.rollback

    # ---- checkpoints, fork, save/load ---------------------------------------------------
    def checkpoint(self) -> Checkpoint:
        """Capture the current guest state (copy of its memory)."""
        with self._lock:
            self._check_open()
            img = self._runner.call(self._shared_image)
            return Checkpoint(img, self._key(), self.turns)

    def restore(self, checkpoint: Checkpoint) -> None:
        """Put the guest back to ``checkpoint`` (taken from this sandbox or a fork of it). A
        restore that is refused or fails leaves the sandbox as it was."""
        if not isinstance(checkpoint, Checkpoint):
            raise ConfigError("restore takes a Checkpoint from checkpoint()")
        with self._lock:
            self._check_open()
            if checkpoint._owner_key != self._key():
                raise ConfigError("checkpoint comes from a sandbox with other mounts or engine")
            if checkpoint._image.size > self.limits.memory:
                raise ConfigError(f"the checkpoint holds a memory of {checkpoint._image.size} "
                                  f"bytes, more than this sandbox's Limits.memory "
                                  f"({self.limits.memory})")

            def job() -> None:
                was = self._current_state()
                checkpoint._image.freeze()
                self._good = checkpoint._image
                try:
                    self._fresh_instance()
                except BaseException:
                    self._good = was  # back to where it was
                    self._fresh_instance()
                    raise

            self._runner.call(job)

    def _current_state(self) -> MemoryImage | None:
        """(runner) An image of the live state to come back to (None: the base state)."""
        if self._inst is None or not self._inst.alive:
            return self._good
        return self._shared_image()

    def fork(self, *, door: Door | None = None) -> Sandbox:
        """An independent sandbox with identical guest state, limits, mounts and /tmp files.
        ``door`` gives the fork a door of its own (default: this sandbox's). The fork's /tmp
        shares this one's files until either side opens one for writing (which then copies
        it), and the two count against one disk quota: a family of forks holds at most
        ``Limits.disk_bytes`` / ``disk_files`` together."""
        return self.fork_many(1, door=door)[0]

    def fork_many(self, n: int, *, door: Door | None = None) -> list[Sandbox]:
        """``n`` independent sandboxes with this one's state, as ``n`` calls of :meth:`fork`
        would make them, from one image of it: every child maps that image copy-on-write
        and shares this one's /tmp files until it writes (each child costs what it writes).
        All or none: when one child cannot be made (the family's disk quota, memory), the
        ones made are closed and the error is raised."""
        n = fork_count(n)
        with self._lock:
            with self._fork_lock:  # checked with the count: a close sees one or the other
                self._check_open()
                self._forking += 1
            kids: list[Sandbox] = []
            try:
                img = self._runner.call(self._shared_image)

                def child() -> Sandbox:
                    self._check_open()  # closed meanwhile: none (the close is the answer)
                    return Sandbox(limits=self.limits, mounts=self.mounts,
                                   door=door if door is not None else self.door,
                                   env=self._env, rollback=self.rollback,
                                   packages=self.packages, _image=img, _family=self)

                _make_all(child, n, kids)
                self._check_open()
            except BaseException:
                for kid in kids:
                    kid.close()
                raise
            finally:
                with self._fork_lock:
                    self._forking -= 1
                    last = self._forking == 0 and self._scratch_left
                if last:
                    self._release_scratch()
            return kids

    def fork_in_turn(self, *, door: Door | None = None, limits: Limits | None = None
                     ) -> Sandbox:
        """:meth:`fork` from inside this sandbox's own turn: for an inline door handler (it
        runs on this sandbox's runner thread), where ``fork()`` would wait for the lock the
        turn holds. The fork holds the guest state as of the end of the last good turn (the
        image a rollback would restore), not the state of the turn in progress; its /tmp is
        copied as it is now. ``door`` gives the fork a door of its own (default: this one);
        ``limits`` its own limits on the same engine (metered or not, as this one)."""
        if not self._runner.on_thread():
            raise SandboxError("fork_in_turn() is for a door handler running inside this "
                               "sandbox's turn (inline); use fork() elsewhere")
        self._check_open()
        lim = limits or self.limits
        if lim.metered != self.limits.metered:
            raise ConfigError("a fork runs on its parent's engine: fuel limits must be both "
                              "set or both unset")
        if not self.rollback:
            raise SandboxError("fork_in_turn() needs rollback=True (it forks the image of "
                               "the last good turn)")
        img = self._good
        if img is None and self.turns <= 1:
            img = self._base  # no turn has ended yet: the starting state is the last good one
        if img is None:
            raise SandboxError("no image of a finished turn to fork from yet")
        img.freeze()  # the fork maps it from now on
        return Sandbox(limits=lim, mounts=self.mounts,
                       door=door if door is not None else self.door, env=self._env,
                       rollback=self.rollback, packages=self.packages, _image=img,
                       _family=self)

    def save(self, path: str | os.PathLike[str], *, portable: bool = False) -> int:
        """Write the guest state to a compressed image file; returns its size in bytes. The
        file holds the pages this session changed on top of this machine's warm image it
        started from (``load`` here maps that image again); ``portable=True`` stores the
        whole memory instead, for a machine that does not have that image."""
        with self._lock:
            self._check_open()
            img = self._runner.call(self._shared_image)
            meta = {"turns": self.turns, "env": dict(self._env),
                    "guest_paths": [g for _, g, _ in self._spec.preopens],
                    "flavour": self._loaded.flavour,
                    "packages": list(self.packages.locked) if self.packages else []}
            return write_image_file(Path(path), img, self._loaded.artifacts.snapshot_sha256,
                                    meta, portable=portable)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, limits: Limits | None = None,
             mounts: Sequence[Mount] = (), door: Door | None = None,
             env: dict[str, str] | None = None, rollback: bool = True,
             packages: PackageSet | Sequence[str] | None = None) -> Sandbox:
        """A sandbox holding the state saved by ``save``. Mounts must sit at the same guest
        paths as when it was saved (the guest's libc remembers them). Its packages are
        exactly the wheels it was saved with (by their hashes: from the cache, else fetched
        from the configured index and checked, else PackageError); ``packages`` given must
        resolve to the same wheels."""
        limits = limits or Limits()
        loaded = load_module("metered" if limits.metered else "plain")
        sha = loaded.artifacts.snapshot_sha256
        img, info = read_image_file(Path(path), sha,
                                    base=lambda name: warm_image_named(name, sha), pending=True,
                                    max_memory=limits.memory)
        want = info.meta.get("guest_paths")
        sb_env = env if env is not None else info.meta.get("env")
        pins = info.meta.get("packages") or []
        have = ["/usr/local/lib", "/memex"]
        if isinstance(want, list):
            have_mounts = [p for p in want if p not in ("/usr/local/lib", "/memex", "/tmp")
                           and not p.startswith(("/usr/local/lib/", "/memex/"))]
            given = [m.guest_path for m in mounts]
            if given != have_mounts:
                img.close()
                raise ImageError(f"{path} was saved with mounts at {have_mounts}; "
                                 f"load() was given {given}")
        del have
        try:
            pins = [str(p) for p in pins] if isinstance(pins, list) else []
            saved = _packages_of(pins, loaded)
            asked = _packages_of(packages, loaded)
            if asked is not None and (saved is None or asked.id != saved.id):
                raise ImageError(f"{path} was saved with packages {pins}; load() was "
                                 f"given {list(asked.pins)}")
            return cls(limits=limits, mounts=mounts, door=door,
                       env=sb_env if isinstance(sb_env, dict) else None, rollback=rollback,
                       packages=saved, _image=img)
        except BaseException:
            img.close()  # a run that does not decode surfaces here: nothing is kept open
            raise

    # ---- files ----------------------------------------------------------------------------
    def read_file(self, guest_path: str, *, max_bytes: int | None = None) -> bytes:
        """Read a file the guest wrote (under /tmp or a mount); ``GuestFileTooLarge``,
        with nothing read, for one larger than ``max_bytes``."""
        self._check_open()
        return _hostfiles.read_file(self._spec.preopens, guest_path, max_bytes)

    def list_files(self, guest_path: str = "/tmp", *, limit: int = 10_000) -> list[GuestFile]:
        """The entries of a folder under /tmp or a mount, sorted by name, at most ``limit``
        (links are listed as links, never followed)."""
        self._check_open()
        return _hostfiles.list_files(self._spec.preopens, guest_path, limit)

    def write_file(self, guest_path: str, data: bytes) -> None:
        """Place a file where the guest can read it (under /tmp or a writable mount)."""
        self._check_open()
        _hostfiles.write_file(self._spec.preopens, self._disk, guest_path, data)

    # ---- lifecycle (close, the context manager, __del__: SandboxHandle) -------------------
    def _shutdown(self, reason: str) -> None:
        """Release the guest, its thread and its /tmp (once)."""
        if self._closed_reason is not None:
            return
        with self.__dict__.get("_running_lock") or contextlib.nullcontext():
            self._closed_reason = reason
            inst = self._inst
            if inst is not None:
                inst.cancel_detail = None
                inst.cancel.set()
        AWAKE.forget(self)
        runner = self.__dict__.get("_runner")
        if runner is not None:
            def job() -> None:
                if self._inst is not None:
                    self._teach_base(self._inst)
                    self._inst.close()
                    self._inst = None
            if runner.on_thread():
                job()
            else:
                runner.call(job)
            runner.stop(timeout=5)
        self._good = self._backing = self._base = self._ref = self._watch = None
        fork_lock = self.__dict__.get("_fork_lock")
        if fork_lock is not None:
            with fork_lock:
                self._scratch_left = self._forking > 0
            if not self._scratch_left:
                self._release_scratch()
        held = self.__dict__.get("_held")
        if held is not None:
            held.release()
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def _release_scratch(self) -> None:
        """This closed sandbox's /tmp: out of its disk ledger and back to the shelf (once,
        after any fork_many still cloning from it)."""
        scratch = self.__dict__.pop("_scratch", None)
        if scratch is not None:
            disk = self.__dict__.get("_disk")
            if disk is not None:
                try:
                    with disk.ledger.lock:
                        disk.ledger.members -= 1
                        disk.ledger.release_tree(self._place)
                except Exception:  # accounting is for the living: never a reason to stay
                    pass
            place = self.__dict__.get("_place")
            _scratch.give_back(str(scratch), place.root if place else str(scratch))

    def __repr__(self) -> str:
        state = self._closed_reason or "open"
        return f"<Sandbox turns={self.turns} {state}>"


def _checked_preload(preload: Iterable[str]) -> tuple[str, ...]:
    names = tuple(preload)
    for name in names:
        if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
            raise ConfigError(f"preload entries are module names, got {name!r}")
    return names


def _packages_of(packages: PackageSet | Sequence[str] | None, loaded: LoadedModule,
                 max_bytes: int | None = None) -> PackageSet | None:
    """The resolved set (requirements are resolved and fetched now, within ``max_bytes``
    unpacked); None for none, and for a set the bundle met whole (nothing to mount)."""
    if isinstance(packages, str):
        raise ConfigError("packages takes a list of requirements, not one string")
    if packages is not None and not isinstance(packages, PackageSet):
        packages = resolve_packages(list(packages), loaded.artifacts,
                                    max_bytes=max_bytes) if packages else None
    return packages if packages is not None and packages.wheels else None


def _checked_mounts(mounts: Sequence[Mount]) -> tuple[Mount, ...]:
    out = tuple(mounts)
    seen = set()
    for m in out:
        if not isinstance(m, Mount):
            raise ConfigError(f"mounts takes Mount objects, got {type(m).__name__}")
        if m.guest_path in seen:
            raise ConfigError(f"two mounts at {m.guest_path}")
        seen.add(m.guest_path)
    return out


_SEEN: set[tuple[Any, ...]] = set()


def _seen_before(key: tuple[Any, ...]) -> bool:
    """Without a warm image on disk, the first plain sandbox of a kind in a process
    bootstraps directly (faster than building the image first); later ones build it (once per
    machine) and start from it, copy-on-write."""
    with _LIVE_LOCK:
        if key in _SEEN:
            return True
        _SEEN.add(key)
        return False


def _make_all(make: Callable[[], Sandbox], n: int, into: list[Sandbox]) -> None:
    """``n`` results of ``make()`` appended to ``into``, made on up to one thread per core: a
    child's instance is made on its own runner thread, with the GIL let go while the engine
    instantiates, so two children are made at once on two cores (64 children of a 141 MiB
    session: see bench/runtime.py, fanout). Every call is waited for; the first error is
    raised after, with every child that was made in ``into`` (the caller closes them)."""
    workers = min(n, os.cpu_count() or 1)
    if workers <= 1:
        for _ in range(n):
            into.append(make())
        return
    failed: BaseException | None = None
    with ThreadPoolExecutor(workers, thread_name_prefix="memex-fork") as pool:
        for fut in [pool.submit(make) for _ in range(n)]:
            try:
                into.append(fut.result())
            except BaseException as exc:  # raised below, once all are in
                failed = failed or exc
    if failed is not None:
        raise failed


def _reap() -> None:
    while True:
        time.sleep(0.25)
        now = time.monotonic()
        with _LIVE_LOCK:
            live = list(_LIVE)
        for sb in live:
            lim = sb.limits
            if sb.closed or sb._busy:
                continue
            if lim.lifetime is not None and now - sb.created > lim.lifetime:
                sb._shutdown("lifetime ended")
            elif lim.idle_timeout is not None and now - sb.last_used > lim.idle_timeout:
                sb._shutdown("idle timeout")


def _start_reaper() -> None:
    global _REAPER
    with _LIVE_LOCK:
        if _REAPER is None:
            _REAPER = threading.Thread(target=_reap, name="memex-reaper", daemon=True)
            _REAPER.start()


@atexit.register
def _close_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for sb in live:
        with contextlib.suppress(Exception):
            sb._shutdown("interpreter exit")
