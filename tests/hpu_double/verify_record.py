"""Checks bridge_signatures.json against the published bridge itself: every
entry's file and line, at the recorded commit, must declare what the record
says. Run by hand where a git copy of the bridge is at hand:

    python tests/hpu_double/verify_record.py /path/to/gaudi-pytorch-bridge[.git]

Entries from a source whose commit the copy lacks are listed as unchecked (pass
a git copy of intel/neural-compressor for the entries known from INC's calls).
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

RECORD = Path(__file__).with_name("bridge_signatures.json")


def _lines(repo: str, commit: str, file: str) -> list[str] | None:
    shown = subprocess.run(
        ["git", f"--git-dir={repo}", "show", f"{commit}:{file}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return shown.stdout.splitlines() if shown.returncode == 0 else None


def _def_signature(lines: list[str], line: int) -> str:
    """The parameter list of the def starting at ``line`` (1-based), without
    annotations, as inspect prints it."""
    text = "\n".join(lines[line - 1 :])
    indent = len(text) - len(text.lstrip())
    source = "\n".join(row[indent:] for row in lines[line - 1 :])
    for end in range(1, len(source.splitlines()) + 1):
        head = "\n".join(source.splitlines()[:end])
        try:
            node = ast.parse(head + "\n    pass").body[0]
        except SyntaxError:
            continue
        assert isinstance(node, ast.FunctionDef), node
        return "(" + ast.unparse(_without_annotations(node.args)) + ")"
    raise ValueError(f"no def at line {line}")


def _without_annotations(args: ast.arguments) -> ast.arguments:
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        arg.annotation = None
    for arg in (args.vararg, args.kwarg):
        if arg is not None:
            arg.annotation = None
    return args


def _check(entry: dict, lines: list[str]) -> str | None:
    if "call" in entry:  # known from its caller: the call is on that line
        return None if entry["call"] in lines[entry["line"] - 1] else "no such call"
    if "signature" in entry:
        found = _def_signature(lines, entry["line"])
        return None if found == entry["signature"] else f"found {found}"
    if "schema" in entry:
        if "schema_text" in entry:  # a C++ declaration: its function name
            name = entry["schema"].split("(")[0].split("::")[1].replace(".", "_")
            return None if f"{name}(" in lines[entry["line"] - 1] else "no declaration"
        return None if entry["schema"] in lines[entry["line"] - 1] else "schema differs"
    return None


def main(repo: str) -> int:
    record = json.loads(RECORD.read_text())
    failures = unchecked = checked = 0
    for group in ("python", "enums", "operators", "registrations"):
        for entry in record[group]:
            commit = record["sources"][entry["source"]]["commit"]
            lines = _lines(repo, commit, entry["file"])
            if lines is None:
                unchecked += 1
                continue
            problem = _check(entry, lines)
            checked += 1
            if problem:
                failures += 1
                print(f"{entry['file']}:{entry['line']}: {problem}")
    print(f"{checked} entries checked, {failures} wrong, {unchecked} not in this copy")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
