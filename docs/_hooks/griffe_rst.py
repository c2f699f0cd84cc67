"""Griffe extension: turn the reST of the library's docstrings into Markdown for mkdocstrings.

The docstrings are Sphinx style: their *fields* (``:param x:``, ``:returns:``) are parsed by
griffe, but the prose keeps reST markup that Markdown does not know. This extension rewrites,
before parsing:

* ``:math:`x```                      -> ``\\(x\\)`` (MathJax through pymdownx.arithmatex);
* ``.. math::`` blocks               -> ``\\[ ... \\]`` display maths;
* ``:class:`~a.b.C``` and other roles -> ```C``` (code; ``~`` keeps the last component);
* a paragraph ending in ``::``        -> ``:`` (the indented block after it stays code).

Example (the rewrite of one line)::

    >>> rst_to_markdown("the mean :math:`(1-p) M` of :class:`~pyro_dropout.AutoDropout`::")
    'the mean \\\\((1-p) M\\\\) of `AutoDropout`:'
"""

from __future__ import annotations

import re

import griffe

_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")
_MATH_DIRECTIVE = re.compile(r"^(\s*)\.\. math::\s*(.*)$")


def _role(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _math_blocks(lines: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(lines):
        m = _MATH_DIRECTIVE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        pad, inline = m.groups()
        body = [inline] if inline else []
        i += 1
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > len(pad)):
            body.append(lines[i].strip())
            i += 1
        # Blank lines separate equations, as in the reST directive.
        equations = [eq.split("\n") for eq in "\n".join(body).split("\n\n") if eq.strip()]
        for eq in equations:
            out += ["", f"{pad}\\[", *(f"{pad}{b}" for b in eq if b), f"{pad}\\]"]
        out.append("")
    return out


def rst_to_markdown(text: str) -> str:
    """Rewrite the reST constructs listed in the module docstring."""
    text = _MATH_ROLE.sub(lambda m: f"\\({m.group(1)}\\)", text)
    text = _ROLE.sub(_role, text)
    lines = _math_blocks(text.splitlines())
    lines = [
        line[:-1] if line.rstrip().endswith("::") and line.strip() != "::" else line
        for line in lines
        if line.strip() != "::"
    ]
    return "\n".join(lines)


class RstToMarkdown(griffe.Extension):
    """Rewrite every docstring when its object is loaded."""

    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
