"""Compare the drop-in's outcomes on TRL's own tests with TRL's, and gate CI on them.

    python tests/trl_upstream/report.py --trl outcomes/trl-1.16.0.json --dropin /tmp/dropin.json
        [--expect outcomes/dropin-passes.txt] [--failures]

The comparison counts the tests TRL passes offline that build a swapped class (``plugin.py`` records both);
of those, the share the drop-in passes, by file. With ``--expect FILE`` (one test id a line, the tests the
drop-in is known to pass) it exits 1 when any of them did not pass in this run, naming each: a drop-in that
used to pass one of TRL's tests and stops is a regression. A test in the drop-in's outcomes that is not in
TRL's record (a new upstream test) is reported, never counted. ``--pick SECONDS`` prints CI's subset
(``ci_tests.txt``): breadth first over the test functions the drop-in passes, within a time budget.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path


def load(path: str) -> dict[str, list]:
    return json.loads(Path(path).read_text())


def in_scope(trl: dict[str, list]) -> set[str]:
    """The tests TRL passes offline that build one of the swapped classes."""
    return {test for test, (outcome, swapped, *_) in trl.items() if outcome == "passed" and swapped}


def table(trl: dict[str, list], dropin: dict[str, list]) -> list[tuple[str, int, int, int, int]]:
    """Per test file: collected, TRL passes, in scope, in scope that ran here, and the drop-in's passes."""
    scope = in_scope(trl)
    rows: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0, 0])
    for test, (outcome, *_) in trl.items():
        row = rows[test.split("::")[0].rsplit("/", 1)[-1]]
        row[0] += 1
        row[1] += outcome == "passed"
        row[2] += test in scope
        row[3] += test in scope and test in dropin
        row[4] += test in scope and dropin.get(test, ["missing"])[0] == "passed"
    return [(name, *counts) for name, counts in sorted(rows.items())]  # type: ignore[misc]


def pick(trl: dict[str, list], dropin: dict[str, list], seconds: float) -> list[str]:
    """CI's subset: tests in scope that the drop-in passed, breadth first — the cheapest parametrization of
    each test function, then the next cheapest of each, … — while their drop-in seconds add up to at most
    ``seconds`` (the call's time recorded in ``dropin``)."""
    passed = [t for t in sorted(in_scope(trl)) if dropin.get(t, ["missing"])[0] == "passed"]
    by_function: dict[str, list[str]] = collections.defaultdict(list)
    for test in passed:
        by_function[test.split("[")[0]].append(test)
    queues = [
        sorted(tests, key=lambda t: (dropin[t][3] if len(dropin[t]) > 3 else 0.0, t)) for tests in by_function.values()
    ]
    chosen: list[str] = []
    spent, rank = 0.0, 0
    while any(rank < len(q) for q in queues):
        for queue in sorted((q for q in queues if rank < len(q)), key=lambda q: dropin[q[rank]][3]):
            cost = dropin[queue[rank]][3]
            if spent + cost <= seconds:
                chosen.append(queue[rank])
                spent += cost
        rank += 1
    return sorted(chosen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl", required=True, help="TRL's recorded outcomes (JSON from plugin.py)")
    parser.add_argument("--dropin", required=True, help="this run's outcomes with --against rlhfkit")
    parser.add_argument("--expect", help="the tests the drop-in must pass (one id a line)")
    parser.add_argument("--failures", action="store_true", help="list each in-scope test the drop-in failed")
    parser.add_argument("--pick", type=float, metavar="SECONDS", help="print CI's subset within this many seconds")
    args = parser.parse_args(argv)
    trl, dropin = load(args.trl), load(args.dropin)
    if args.pick is not None:
        print("\n".join(pick(trl, dropin, args.pick)))
        return 0

    print(f"{'test file':<26} {'collected':>9} {'TRL passes':>10} {'in scope':>8} {'ran':>5} {'drop-in passes':>14}")
    total = [0, 0, 0, 0, 0]
    for name, *counts in table(trl, dropin):
        total = [a + b for a, b in zip(total, counts)]
        share = f"{counts[4] / counts[3]:.0%}" if counts[3] else "-"
        print(f"{name:<26} {counts[0]:>9} {counts[1]:>10} {counts[2]:>8} {counts[3]:>5} {counts[4]:>8} ({share:>4})")
    share = f"{total[4] / total[3]:.1%}" if total[3] else "-"
    print(f"{'all':<26} {total[0]:>9} {total[1]:>10} {total[2]:>8} {total[3]:>5} {total[4]:>8} ({share})")

    new = sorted(set(dropin) - set(trl))
    if new:
        print(f"{len(new)} test(s) not in TRL's record (not counted): {', '.join(new[:5])}")
    scope = in_scope(trl)
    if args.failures:
        for test in sorted(scope & set(dropin)):
            outcome, _, *reason = dropin[test]
            if outcome != "passed":
                print(f"  {outcome}: {test}: {reason[0] if reason else ''}")
    if args.expect:
        expected = [line.strip() for line in Path(args.expect).read_text().splitlines() if line.strip()]
        broken = [t for t in expected if t in dropin and dropin[t][0] != "passed"]
        for test in broken:
            print(f"REGRESSION: the drop-in passed {test} and now: {dropin[test][0]}: {dropin[test][2]}")
        if broken:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
