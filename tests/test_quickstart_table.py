"""The quickstart's table in the README and in docs/results.md is the one `rlhfkit quickstart` prints
(issue 42: the README's table had drifted from what a fresh clone printed).

The quickstart's scores are fixed by its seed on one machine and one set of dependency versions
(requirements/lock.txt, which `make setup` installs): the slow test runs the command as the README
does and compares its printed table with the README's rows, digit for digit, and its table and
sample completions with docs/results.md's. The fast tests keep the two documents in agreement and
the README's rows in the command's printed format, so a hand edit of either is caught in `make test`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.quickstart import print_table

ROOT = Path(__file__).resolve().parents[1]
HEADER = "policy   oracle score  RM score  KL to SFT  length"
POLICIES = ["SFT", "PPO", "GRPO", "DPO", "SFT-S", "Distill"]


def table_rows(text: str) -> list[str]:
    """The first quickstart table in ``text``: its header line and the rows under it (to the first
    blank line or code fence), each with trailing spaces removed."""
    lines = [line.rstrip() for line in text.splitlines()]
    start = lines.index(HEADER)
    rows = []
    for line in lines[start:]:
        if not line or line.startswith("```"):
            break
        rows.append(line)
    return rows


def sample_lines(text: str) -> list[str]:
    """The sample-completion lines under the first "sample completions" heading of ``text``."""
    lines = [line.rstrip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("sample completions"))
    rows = []
    for line in lines[start + 1 :]:
        if not line or line.startswith("```"):
            break
        rows.append(line)
    return rows


def quickstart_section(path: Path) -> str:
    """docs/results.md from its "## The quickstart" heading to the next one."""
    text = path.read_text()
    start = text.index("## The quickstart")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def readme_rows() -> list[str]:
    return table_rows((ROOT / "README.md").read_text())


def rerendered(rows: list[str], capsys) -> list[str]:
    """``rows`` parsed back into numbers and printed by the quickstart's own ``print_table``."""
    results = {}
    for row in rows[1:]:
        name, oracle, rm, kl, length = row.split()
        metrics = {
            "eval/oracle_reward_mean": float(oracle),
            "eval/rm_mean": float(rm),
            "eval/kl_to_reference": float(kl),
            "eval/response_length_mean": float(length),
        }
        results[name] = {"metrics": metrics, "samples": []}
    capsys.readouterr()
    print_table(results, 0.0)
    return table_rows(capsys.readouterr().out)


def test_the_readme_quotes_every_policy_of_the_quickstart_in_its_printed_format(capsys):
    rows = readme_rows()
    assert rows[0] == HEADER
    assert [row.split()[0] for row in rows[1:]] == POLICIES
    assert rerendered(rows, capsys) == rows


def test_the_readme_and_docs_results_quote_the_same_quickstart_table():
    assert table_rows(quickstart_section(ROOT / "docs" / "results.md")) == readme_rows()


def test_the_readme_prose_quotes_the_tables_oracle_scores():
    """The sentence under the README's table rounds the table's oracle scores (SFT first)."""
    text = (ROOT / "README.md").read_text()
    scores = {row.split()[0]: float(row.split()[1]) for row in readme_rows()[1:]}
    prose = re.search(r"The oracle score \(which no policy ever sees\) rises from (.*?)\(", text, re.S).group(1)
    quoted = [float(x) for x in re.findall(r"\d\.\d+", prose)]
    assert quoted == [round(scores[p], 2) for p in POLICIES]


@pytest.mark.slow
def test_the_quickstart_prints_the_readme_table(tmp_path):
    """`rlhfkit quickstart --quiet` (what `make quickstart` runs) on this checkout prints the README's
    table exactly, and docs/results.md's table and sample completions (~100 s on 2 cores)."""
    out = subprocess.run(
        [sys.executable, "-m", "rlhfkit", "quickstart", "--quiet", "--output-dir", str(tmp_path / "qs")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1800,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert table_rows(out.stdout) == readme_rows(), out.stdout
    results = quickstart_section(ROOT / "docs" / "results.md")
    assert table_rows(out.stdout) == table_rows(results)
    assert sample_lines(out.stdout) == sample_lines(results)
