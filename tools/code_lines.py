"""Code lines of the Python files below a folder: lines that hold a token of code, without
docstrings, comments and blank lines (issue 38 counts ``pyro_dropout/infer`` this way).

    python tools/code_lines.py pyro_dropout/infer
    python tools/code_lines.py pyro_dropout/infer --at b220d6f   # as committed there

Prints one line per file and the total. ``--at REV`` reads the files of that commit through
``git show`` (run from the repository).
"""

import argparse
import ast
import io
import subprocess
import tokenize
from pathlib import Path

_LAYOUT = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def code_lines(source):
    """The number of lines of ``source`` that hold code (a docstring of a module, class or
    function is not code)."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _LAYOUT:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def _sources(folder, rev):
    if rev is None:
        for path in sorted(Path(folder).rglob("*.py")):
            yield path.relative_to(folder).as_posix(), path.read_text()
        return
    prefix = folder.rstrip("/") + "/"
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, prefix],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in sorted(n for n in names if n.endswith(".py")):
        show = ["git", "show", f"{rev}:{name}"]
        yield (
            name[len(prefix) :],
            subprocess.run(show, check=True, capture_output=True, text=True).stdout,
        )


def count(folder, rev=None):
    """``{file: code lines}`` of the Python files below ``folder`` (at ``rev``)."""
    return {name: code_lines(source) for name, source in _sources(folder, rev)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--at", help="a commit: count its files instead of the working tree")
    args = parser.parse_args(argv)
    counts = count(args.folder, args.at)
    for name, n in counts.items():
        print(f"{n:6d} {name}")
    print(f"{sum(counts.values()):6d} total")
    return counts


if __name__ == "__main__":
    main()
