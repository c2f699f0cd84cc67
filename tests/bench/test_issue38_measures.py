"""The two measures issue 38's line-count item is judged by: ``tools/code_lines.py`` (code lines
without docstrings, comments and blanks) and ``tools/capture_pass_ops.py`` (what each capture
pass removes from a loss graph)."""

import subprocess
import textwrap

import pytest

from pyro_dropout.infer import capture

from ._uci import load_tool

pytestmark = pytest.mark.usefixtures("one_thread")


def test_code_lines_counts_code_only():
    source = textwrap.dedent(
        '''
        """Module docstring,
        two lines."""

        import os  # a comment


        def f(x):
            """Docstring."""
            # a comment line
            s = """not a docstring:
            three lines
            of code"""
            return (x,
                    s)


        class C:
            "One line."
            y = 1
        '''
    )
    # import, def, s = (three lines), return (two), class, y
    assert load_tool("code_lines.py").code_lines(source) == 9


def test_code_lines_reads_a_commit_as_committed(tmp_path, monkeypatch):
    tool = load_tool("code_lines.py")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\ny = 2\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")  # the tree moves on
    (tmp_path / "pkg" / "b.py").write_text("z = 3  # new\n")
    monkeypatch.chdir(tmp_path)
    assert tool.count("pkg") == {"a.py": 1, "b.py": 1}
    assert tool.count("pkg", "HEAD") == {"a.py": 2}


def test_each_measured_pass_removes_operations_and_is_restored():
    tool = load_tool("capture_pass_ops.py")
    originals = {name: getattr(capture, name) for r in tool.PASSES.values() for name in r or {}}
    init = capture.Captured.__init__
    counts = {c: tool.count("W1", "AutoDropout", c) for c in tool.PASSES}
    assert counts["no _combine_outputs"] > counts["all passes"] + 10
    assert counts["no scalar/identity rewrites"] > counts["all passes"] + 10
    assert counts["no linear-bias fusion"] > counts["all passes"]
    # restored: the library's capture is as it was
    assert {name: getattr(capture, name) for name in originals} == originals
    assert capture.Captured.__init__ is init
