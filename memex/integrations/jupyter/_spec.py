"""The kernelspec and the launcher: ``memex kernel install`` writes a kernelspec whose argv
starts ``python -m memex.integrations.jupyter`` with the sandbox's settings (limits, mounts,
preload, egress policy); the launcher reads them back and starts the kernel."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ipykernel.kernelapp import IPKernelApp
from jupyter_client.kernelspec import KernelSpecManager

from ...errors import ConfigError
from ...runtime_wasm import KERNEL_LIMITS, Limits, Mount
from . import _kernel

__all__ = ["install_kernelspec", "kernelspec", "launch", "settings_from_args"]


def _settings_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memex kernel", add_help=False)
    p.add_argument("--timeout", default=None)
    p.add_argument("--memory", default=None)
    p.add_argument("--fuel", type=int, default=None)
    p.add_argument("--mount", action="append", default=[])
    p.add_argument("--preload", default="")
    p.add_argument("--policy", default=None)
    return p


def settings_from_args(argv: Sequence[str]) -> tuple[_kernel.KernelSettings, list[str]]:
    """The kernel's settings from its argv, and the arguments left for ipykernel."""
    ns, rest = _settings_parser().parse_known_args(list(argv))
    given = {k: v for k, v in (("timeout", ns.timeout), ("memory", ns.memory),
                               ("fuel", ns.fuel)) if v is not None}
    return _kernel.KernelSettings(
        limits=Limits.from_mapping(given, base=KERNEL_LIMITS, where="kernel limits"),
        mounts=tuple(Mount.parse(m) for m in ns.mount),
        preload=tuple(x for x in ns.preload.split(",") if x), policy=ns.policy), rest


def kernelspec(*, display_name: str = "MemEx (sandboxed Python)", timeout: float | None = None,
               memory: int | None = None, fuel: int | None = None,
               mounts: Sequence[str] = (), preload: Sequence[str] = (),
               policy: str | None = None, python: str | None = None) -> dict[str, Any]:
    """The kernel.json of a MemEx kernel with these sandbox settings."""
    if timeout is None:
        timeout = KERNEL_LIMITS.timeout
    argv = [python or sys.executable, "-m", "memex.integrations.jupyter",
            "-f", "{connection_file}", "--timeout", str(timeout)]
    if memory is not None:
        argv += ["--memory", str(memory)]
    if fuel is not None:
        argv += ["--fuel", str(fuel)]
    for m in mounts:
        Mount.parse(m)  # refuse a bad mount now, not when the kernel starts
        argv += ["--mount", str(m)]
    if preload:
        argv += ["--preload", ",".join(preload)]
    if policy is not None:
        argv += ["--policy", str(Path(policy).resolve())]
    return {"argv": argv, "display_name": display_name, "language": "python",
            "interrupt_mode": "message",
            "metadata": {"memex": {"timeout": timeout, "memory": memory, "fuel": fuel,
                                   "mounts": list(mounts), "preload": list(preload),
                                   "policy": policy}}}


def install_kernelspec(name: str = "memex", *, user: bool = True, prefix: str | None = None,
                       **settings: Any) -> str:
    """Install the kernelspec (``jupyter kernelspec list`` shows it); its folder."""
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"a kernel name is letters, digits, - and _, got {name!r}")
    spec = kernelspec(**settings)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(spec, indent=2))
        where: str = KernelSpecManager().install_kernel_spec(
            tmp, kernel_name=name, user=user and prefix is None, prefix=prefix)
    return where


def launch(argv: Sequence[str] | None = None) -> None:
    """Start a MemEx kernel (what a kernelspec's argv runs)."""
    settings, rest = settings_from_args(sys.argv[1:] if argv is None else argv)
    _kernel.SETTINGS = settings
    IPKernelApp.launch_instance(argv=rest, kernel_class=_kernel.MemexKernel)
