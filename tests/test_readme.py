"""Every Python example of the README and of the documentation's guides runs as written, and what the
README and the guides state about the presets and their links holds.

A block fenced ```python is executed; one that needs a GPU, vLLM or several processes is fenced as
something else (```py, ```bash, ```text) and only shown. A block repeated verbatim on several pages
runs once.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]


def _python_blocks():
    blocks = {}  # code -> where it first appears
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, match.start()) + 1
            blocks.setdefault(match.group(1), f"{page.relative_to(ROOT)}:{line}")
    return [pytest.param(code, id=where) for code, where in blocks.items()]


BLOCKS = _python_blocks()


def test_the_examples_are_found():
    # The README held 6 Python examples before the guides took 5 of them over (issue 32); none is lost.
    assert len(BLOCKS) >= 6, [b.id for b in BLOCKS]


@pytest.mark.parametrize("code", BLOCKS)
def test_python_block_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "example", "exec"), {"__name__": "readme"})


# --- the presets table (README "The presets", docs/guides/rl.md "The presets") ---------------------

PRESETS_HEADER = "| preset | estimator | policy loss | aggregation | KL | critic | G |"


def _preset_rows(page):
    lines = page.read_text().splitlines()
    start = lines.index(PRESETS_HEADER) + 2  # past the header and the |---| line
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        name, estimator, loss, aggregation, kl, critic, group = (c.strip() for c in line.strip("|").split("|"))
        rows[name.strip("`")] = (estimator, loss, aggregation, kl, critic, group)
    return rows


def _loss_cell(cell):
    """'`ppo_clip`, level `sequence`, clip 3e-4/4e-4' -> (policy_loss, level, clip_low, clip_high)."""
    loss = re.match(r"`(\w+)`", cell).group(1)
    level = re.search(r"level `(\w+)`", cell)
    clip = re.search(r"clip ([\d.e-]+)/([\d.e-]+)", cell)
    cap = re.search(r"cap 1 \+ ([\d.e-]+)", cell)
    clip_low, clip_high = (float(clip[1]), float(clip[2])) if clip else (0.2, float(cap[1]) if cap else 0.2)
    return loss, level[1] if level else "token", clip_low, clip_high


def _kl_cell(config):
    if config.kl_coef == 0:
        return "off"
    return f"{config.kl_estimator} in the {'reward' if config.kl_in_reward else 'loss'}"


@pytest.mark.parametrize("page", ["README.md", "docs/guides/rl.md"])
def test_presets_table_matches_the_presets(page):
    from rlhfkit import RLConfig
    from rlhfkit.config import PRESETS

    rows = _preset_rows(ROOT / page)
    assert list(rows) == list(PRESETS), "one row per preset, in PRESETS' order"
    for name, (estimator, loss, aggregation, kl, critic, group) in rows.items():
        c = RLConfig(algorithm=name)
        assert estimator == f"`{c.advantage_estimator}`", name
        clip_low = c.clip_low if c.policy_loss != "cispo" else 0.2  # CISPO caps above only
        assert _loss_cell(loss) == (c.policy_loss, c.importance_sampling_level, clip_low, c.clip_high), name
        assert (aggregation, kl, critic, group) == (
            c.loss_agg,
            _kl_cell(c),
            "yes" if c.use_critic else "no",
            str(c.group_size),
        ), name


# --- the README's links into the repository and the documentation ----------------------------------


def test_readme_links_point_to_files_that_exist():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links into docs/"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing
