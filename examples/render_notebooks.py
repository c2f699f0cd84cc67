"""Execute the example notebooks and write their ``.ipynb`` twins, outputs included.

The ``NN_*.py`` files (jupytext percent format) are the sources; the ``.ipynb`` files are
generated from them and committed with their outputs, so the figures show on GitHub and in
the docs. After editing a ``.py``::

    python examples/render_notebooks.py                 # every notebook, full budget
    python examples/render_notebooks.py 03              # the notebooks whose name contains 03
    python examples/render_notebooks.py --quick 01 02   # quick budget (PYRO_DROPOUT_QUICK=1)

Needs ``jupytext``, ``nbclient`` and ``ipykernel`` (``pip install pyro-dropout[docs]``). The
kernel is this interpreter's ``python3``; per-cell execution timestamps are dropped so that a
re-run only changes what the code printed or drew.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent


def notebooks(patterns: list[str]) -> list[Path]:
    """The notebook sources whose file name contains one of ``patterns`` (all if empty)."""
    found = sorted(EXAMPLES.glob("[0-9][0-9]_*.py"))
    return [p for p in found if not patterns or any(s in p.name for s in patterns)]


def render(path: Path, timeout: int = 1800) -> float:
    """Execute ``path`` in a fresh kernel and write ``path.with_suffix('.ipynb')``; seconds."""
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(path)
    start = time.perf_counter()
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}}
    )
    client.execute()
    seconds = time.perf_counter() - start
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    jupytext.write(nb, path.with_suffix(".ipynb"))
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="substrings of the notebooks to render")
    parser.add_argument("--quick", action="store_true", help="set PYRO_DROPOUT_QUICK=1")
    args = parser.parse_args(argv)
    os.environ["PYRO_DROPOUT_QUICK"] = "1" if args.quick else "0"
    # tqdm.auto (imported by pyro_dropout.infer.fit) warns in a kernel without ipywidgets;
    # the notebooks fit with progress=False, so the warning is noise in the saved outputs.
    os.environ["PYTHONWARNINGS"] = "ignore:IProgress not found"
    for path in notebooks(args.names):
        print(f"{path.name}: executing ...", flush=True)
        print(f"{path.name}: {render(path):.0f} s -> {path.with_suffix('.ipynb').name}", flush=True)


if __name__ == "__main__":
    main()
