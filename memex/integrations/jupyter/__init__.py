"""A Jupyter kernel whose cells run in a MemEx sandbox (``memex kernel install``): streamed
output, rich reprs, matplotlib figures, errors with trimmed tracebacks, interrupts that roll
the cell back, limits/mounts/policy from the kernelspec. ``_kernel`` is the kernel,
``_spec`` the kernelspec and its launcher. Needs the ``jupyter`` extra."""

from ._kernel import KernelSettings, MemexKernel
from ._spec import install_kernelspec, kernelspec, launch, settings_from_args

__all__ = ["KernelSettings", "MemexKernel", "install_kernelspec", "kernelspec", "launch",
           "settings_from_args"]
