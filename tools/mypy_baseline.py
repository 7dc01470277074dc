"""mypy on the package against a baseline that may only shrink (make lint; .ci/run).

The baseline (tools/mypy_baseline.txt) holds the errors mypy reported when it was introduced, one line per
error: ``file [code] message``, without line numbers, so editing a file does not move its entries. The check
runs mypy (configured in pyproject.toml, [tool.mypy]) and compares the two as multisets:

- an error that is not in the baseline (or one more of an entry than it counts) fails the check, and is
  printed with its line number;
- a baseline entry that mypy no longer reports fails the check too: the baseline only shrinks, and it
  shrinks in the commit that fixes the error (``--update`` rewrites it from the current errors);
- ``--update`` refuses to add an entry unless ``--allow-grow`` is given (for a mypy upgrade or a new untyped
  dependency, say so in the commit), and never for a file that has no entry: a new module (or one made clean)
  stays clean.

    python tools/mypy_baseline.py                 # the check; exit 1 on a new error or a stale entry
    python tools/mypy_baseline.py --update        # drop the entries that disappeared
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tools" / "mypy_baseline.txt"
HEADER = (
    "# mypy's errors on rlhfkit/ still accepted: `file [code] message`, one line per error, no line numbers.\n"
    "# tools/mypy_baseline.py fails on any error not here and on an entry mypy no longer reports; fix one, then\n"
    "# shrink this file with `python tools/mypy_baseline.py --update` (it refuses to grow it without --allow-grow,\n"
    "# and never for a file with no entry: a new module starts clean). Empty since issue 53: mypy is clean.\n"
)
# path:line[:column]: error: message  [code]
ERROR = re.compile(
    r"^(?P<path>[^:\s][^:]*):(?P<line>\d+)(?::\d+)?: error: (?P<message>.*?)(?:  \[(?P<code>[\w-]+)\])?$"
)


def parse(output: str) -> list[tuple[str, str]]:
    """(key, the line as mypy printed it) for each error in mypy's output. The key is ``file [code]
    message`` with every "line N" in the message made "line N", so moving code does not change it."""
    errors = []
    for line in output.splitlines():
        m = ERROR.match(line.strip())
        if m:
            message = re.sub(r"\bline \d+\b", "line N", m["message"])
            path = m["path"].replace("\\", "/")
            errors.append((f"{path} [{m['code'] or 'misc'}] {message}", line.strip()))
    return errors


def run_mypy(args: list[str]) -> tuple[int, str]:
    """mypy on the package (pyproject.toml's [tool.mypy] names the files), from the repository root."""
    proc = subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def read_baseline(path: Path) -> Counter:
    if not path.exists():
        return Counter()
    lines = path.read_text(encoding="utf-8").splitlines()
    return Counter(line for line in lines if line.strip() and not line.startswith("#"))


def write_baseline(path: Path, errors: Counter) -> None:
    path.write_text(HEADER + "".join(f"{key}\n" for key in sorted(errors.elements())), encoding="utf-8")


def compare(current: list[tuple[str, str]], baseline: Counter) -> tuple[list[str], Counter]:
    """The errors not covered by the baseline (mypy's own lines: the first ones of a key beyond the
    baseline's count of it are taken as the new ones), and the baseline entries mypy no longer reports."""
    left = Counter(baseline)
    new = []
    for key, line in current:
        if left[key] > 0:
            left[key] -= 1
        else:
            new.append(line)
    return new, +left


def files_without_entries(new: list[str], baseline: Counter) -> list[str]:
    """The new errors (mypy's lines) in files the baseline holds no entry for."""
    listed = {key.split(" ", 1)[0] for key in baseline}
    return [line for line in new if ERROR.match(line) and ERROR.match(line)["path"].replace("\\", "/") not in listed]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="rewrite the baseline from mypy's current errors")
    parser.add_argument("--allow-grow", action="store_true", help="with --update: let the baseline gain entries")
    parser.add_argument("--baseline", type=Path, default=BASELINE, help="default: %(default)s")
    parser.add_argument("--mypy-output", type=Path, help="read mypy's output from this file instead of running it")
    opts = parser.parse_args(argv)

    if opts.mypy_output is not None:
        code, output = 1, opts.mypy_output.read_text(encoding="utf-8")
    else:
        code, output = run_mypy([])
    current = parse(output)
    if code not in (0, 1) or (code == 1 and not current):  # 2: mypy itself failed (a config or syntax error)
        print(output, end="")
        print(f"mypy_baseline: mypy failed (exit status {code}) without a list of errors", file=sys.stderr)
        return 2
    baseline = read_baseline(opts.baseline)
    new, gone = compare(current, baseline)

    if opts.update:
        unlisted = files_without_entries(new, baseline)
        if unlisted:
            print("\n".join(unlisted))
            print(f"mypy_baseline: {len(unlisted)} error(s) in files with no baseline entry: a new module starts clean")
            return 1
        if new and not opts.allow_grow:
            print("\n".join(new))
            print(
                f"mypy_baseline: {len(new)} error(s) not in {opts.baseline}: fix them, "
                "or pass --allow-grow to accept them"
            )
            return 1
        write_baseline(opts.baseline, Counter(key for key, _ in current))
        print(
            f"mypy_baseline: {opts.baseline} now holds {len(current)} error(s) "
            f"({sum(gone.values())} dropped, {len(new)} added)"
        )
        return 0

    if gone:
        print(f"mypy_baseline: {sum(gone.values())} baseline error(s) no longer reported; shrink the baseline with")
        print("  python tools/mypy_baseline.py --update")
        for key, count in sorted(gone.items()):
            print(f"  gone: {key}" + (f" (x{count})" if count > 1 else ""))
    if new:
        print(f"mypy_baseline: {len(new)} new error(s), not in {opts.baseline.name}:")
        print("\n".join(f"  {line}" for line in new))
    if new or gone:
        return 1
    print(f"mypy_baseline: OK, {len(current)} error(s), all in the baseline ({sum(baseline.values())} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
