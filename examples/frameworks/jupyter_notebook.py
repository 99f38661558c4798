"""A notebook executed on the MemEx Jupyter kernel with nbclient (what papermill and CI
notebook runners use): state across cells, a DataFrame's rich repr, a runaway cell stopped by
the cell timeout and rolled back, the next cell working.

Run: ``python examples/frameworks/jupyter_notebook.py`` (needs the ``jupyter`` extra). It
installs the kernelspec into a temporary prefix; ``memex kernel install`` installs it for
JupyterLab.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import nbformat
from _common import EXPECTED, SALES
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from memex.integrations.jupyter import install_kernelspec

CELLS = [
    f"import pandas as pd\nsales = {SALES!r}\n"
    "df = pd.DataFrame([(r, a) for r, amounts in sales.items() for a in amounts],\n"
    "                  columns=['region', 'amount'])",
    "totals = df.groupby('region').amount.sum()\ntotals.to_frame()",
    "while True:\n    df['amount'] += 1  # runaway: stopped by the cell timeout",
    "f'{totals.idxmax()} {int(df.groupby(\"region\").amount.sum().max())}'",
]


def cell_timeout(cell: nbformat.NotebookNode) -> int:
    """Seconds nbclient waits for a cell: only the runaway is meant to reach it (importing
    pandas in a fresh guest takes seconds on a loaded machine)."""
    return 5 if cell.source.startswith("while True") else 300


def main() -> None:
    with tempfile.TemporaryDirectory() as prefix:
        install_kernelspec("memex-example", prefix=prefix, timeout=60, memory=512 << 20)
        specs = KernelSpecManager()
        specs.kernel_dirs = [str(Path(prefix) / "share" / "jupyter" / "kernels")]
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
        km = AsyncKernelManager(kernel_name="memex-example", kernel_spec_manager=specs)
        NotebookClient(nb, km=km, timeout_func=cell_timeout, interrupt_on_timeout=True,
                       allow_errors=True).execute()
    for i, cell in enumerate(nb.cells):
        for out in cell.outputs:
            kind = out["output_type"]
            if kind == "error":
                print(f"cell {i}: error {out['ename']} (the cell was rolled back)")
            elif "data" in out:
                shown = sorted(out["data"])
                text = out["data"].get("text/plain", "").splitlines()
                print(f"cell {i}: {kind} {shown}: {text[0] if text else ''}")
    last = nb.cells[-1].outputs
    answer = last[0]["data"]["text/plain"].strip("'") if last and "data" in last[0] else None
    print(f"answer: {answer!r} (expected {EXPECTED!r})")


if __name__ == "__main__":
    main()
