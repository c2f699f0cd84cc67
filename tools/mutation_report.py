"""Summarise a finished ``mutmut run`` (see ``docs/mutation.md``): the score per module and the
surviving mutants, each with its diff, sorted into

* ``message``: only the text of an error or warning message changed (the message the user
  reads, not a result; the messages that matter are pinned by ``pytest.raises(match=...)``);
* ``result``: anything else, to be killed by a test or argued equivalent in
  ``tools/mutation_equivalent*.txt`` (one mutant name per line, then ``#`` and the reason).

    python tools/mutation_report.py [--out mutation-report.md]

Run from the directory where ``mutmut run`` ran (it reads ``mutants/**/*.meta`` and calls
``mutmut show``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = sorted((ROOT / "tools").glob("mutation_equivalent*.txt"))
# Mutants killed by a test that cannot run under mutmut (listed with that test; each verified
# with `mutmut apply`, see docs/mutation.md).
KILLED_BY_APPLY = ROOT / "tools" / "mutation_killed_by_apply.txt"


def _statuses(mutants: Path) -> dict[str, int | None]:
    out = {}
    for meta in mutants.rglob("*.meta"):
        out.update(json.loads(meta.read_text())["exit_code_by_key"])
    return out


def _diff(name: str) -> str:
    proc = subprocess.run(["mutmut", "show", name], capture_output=True, text=True, check=False)
    return proc.stdout


_STRING = re.compile(r"""(?:[rbfu]{0,2})("[^"\\]*(?:\\.[^"\\]*)*"|'[^'\\]*(?:\\.[^'\\]*)*')""")


def _without_strings(line: str) -> str:
    return _STRING.sub('""', line)


def _is_message_only(diff: str) -> bool:
    """Every changed line differs only inside string literals, in a raise/warn statement."""
    minus = [
        line[1:]
        for line in diff.splitlines()
        if line.startswith("-") and not line.startswith("---")
    ]
    plus = [
        line[1:]
        for line in diff.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]
    if not minus or len(minus) != len(plus):
        return False
    if any(_without_strings(a) != _without_strings(b) for a, b in zip(minus, plus, strict=True)):
        return False
    context = diff
    return bool(re.search(r"raise |warnings\.warn|_report\(|Error\(|Warning", context))


def _equivalent(paths=None) -> set[str]:
    names = set()
    for path in EQUIVALENT if paths is None else paths:
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                names.add(line)
    return names


def main(argv=None):
    from mutmut.stats import status_by_exit_code

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=Path, default=Path("mutants"))
    parser.add_argument("--out", type=Path, default=Path("mutation-report.md"))
    args = parser.parse_args(argv)
    status = _statuses(args.mutants)
    equivalent = _equivalent()
    by_apply = _equivalent([KILLED_BY_APPLY] if KILLED_BY_APPLY.exists() else [])
    per_module = defaultdict(Counter)
    survivors = defaultdict(list)
    for name, code in sorted(status.items()):
        module = name.split(".x", 1)[0]
        kind = status_by_exit_code[code]  # mutmut's own reading of the exit code
        if kind == "timeout":
            kind = "killed"  # the tests did not finish: detected
        if kind == "survived" and name in by_apply:
            kind = "killed"
        if kind == "survived":
            diff = _diff(name)
            if name in equivalent:
                kind = "equivalent"
            elif _is_message_only(diff):
                kind = "message"
            else:
                kind = "result"
            survivors[kind].append((name, diff))
        per_module[module][kind] += 1
    total = Counter()
    for c in per_module.values():
        total.update(c)
    killed = total["killed"]
    counted = killed + total["result"] + total["message"] + total["equivalent"]
    lines = ["# Mutation testing report", ""]
    lines.append(
        f"{sum(total.values())} mutants: {killed} killed, {total['equivalent']} equivalent, "
        f"{total['message']} changing only a message's text, {total['result']} surviving "
        "that change a result."
    )
    if counted:
        lines.append("")
        lines.append(
            f"Score (killed / non-equivalent): {killed / max(counted - total['equivalent'], 1):.1%}"
            f"; counting message-only mutants as neither: "
            f"{killed / max(killed + total['result'], 1):.1%}."
        )
    lines += [
        "",
        "| module | killed | equivalent | message | result | other |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for module, c in sorted(per_module.items()):
        other = sum(
            v for k, v in c.items() if k not in ("killed", "equivalent", "message", "result")
        )
        lines.append(
            f"| {module} | {c['killed']} | {c['equivalent']} | {c['message']} | {c['result']} | {other} |"
        )
    for kind in ("result", "equivalent", "message"):
        lines += ["", f"## Survivors: {kind} ({len(survivors[kind])})", ""]
        for name, diff in survivors[kind]:
            lines += [f"### {name}", "", "```diff", diff.strip(), "```", ""]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:12]))


if __name__ == "__main__":
    main()
