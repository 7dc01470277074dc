"""reasoning-gym tasks by name (rlhfkit/data/reasoning_gym.py) and the reward ``reasoning_gym``
(rlhfkit/rewards/reasoning_gym.py): sources in Python, YAML and on the command line, one-line
errors, the exact entry reaching the task's checker, train/eval disjoint, weighted mixes."""

import sys
import warnings

import pytest
import yaml

pytest.importorskip("reasoning_gym")

from reasoning_gym.utils import SYSTEM_PROMPTS  # noqa: E402

import rlhfkit.data.reasoning_gym as rg_data  # noqa: E402
from rlhfkit.cli import main  # noqa: E402
from rlhfkit.config import load_config  # noqa: E402
from rlhfkit.data import load_prompt_dataset  # noqa: E402
from rlhfkit.jobs import RLJob  # noqa: E402
from rlhfkit.rewards import RewardFunctions, get_reward_function  # noqa: E402

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # a few hundred distinct questions


def score(rows, completions, **overrides):
    """The registered reward on ``rows`` (one completion each), as the trainer calls it."""
    columns = {k: [row.get(k) for row in rows] for k in rg_data.COLUMNS}
    columns.update(overrides)
    return get_reward_function("reasoning_gym")(prompts=[r["prompt"] for r in rows], completions=completions, **columns)


def questions(rows):
    return [row["reasoning_gym_entry"]["question"] for row in rows]


def one_line_error(source, name="train_dataset", train_rows=None):
    with pytest.raises(ValueError) as err:
        load_prompt_dataset(source, name=name, train_rows=train_rows)
    message = str(err.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- sources
def test_a_task_by_name_gives_chat_prompts_and_the_entries():
    rows = load_prompt_dataset("reasoning_gym:leg_counting")
    assert len(rows) == rg_data.DEFAULT_SIZE
    import reasoning_gym

    expected = reasoning_gym.create_dataset("leg_counting", size=3, seed=0)
    for row, entry in zip(rows, expected):
        assert row["prompt"] == [
            {"role": "system", "content": SYSTEM_PROMPTS["default"]},
            {"role": "user", "content": entry["question"]},
        ]
        assert row["reasoning_gym_task"] == "leg_counting" and row["reasoning_gym_entry"] == entry
        assert row["reasoning_gym_config"] == {}


def test_a_mapping_sets_size_seed_options_and_system_prompt():
    source = {"reasoning_gym": "basic_arithmetic", "size": 6, "seed": 7, "config": SMALL, "system_prompt": None}
    rows = load_prompt_dataset(source)
    import reasoning_gym

    expected = list(reasoning_gym.create_dataset("basic_arithmetic", size=6, seed=7, **SMALL))
    assert [row["reasoning_gym_entry"] for row in rows] == expected
    assert all(row["prompt"] == [{"role": "user", "content": row["reasoning_gym_entry"]["question"]}] for row in rows)
    assert all(row["reasoning_gym_config"] == SMALL for row in rows)
    direct = load_prompt_dataset({**source, "system_prompt": "direct"})
    assert direct[0]["prompt"][0] == {"role": "system", "content": SYSTEM_PROMPTS["direct"]}


def test_yaml_and_command_line_sources(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "train_dataset": {"reasoning_gym": "basic_arithmetic", "size": 5, "seed": 3},
                "reward_funcs": ["reasoning_gym"],
            }
        )
    )
    job = load_config(RLJob, recipe, ["eval_dataset={reasoning_gym: {leg_counting: 1, basic_arithmetic: 1}, size: 4}"])
    assert job.train_dataset == {"reasoning_gym": "basic_arithmetic", "size": 5, "seed": 3}
    assert len(load_prompt_dataset(job.train_dataset)) == 5
    assert len(load_prompt_dataset(job.eval_dataset, name="eval dataset")) == 4
    job = load_config(RLJob, recipe, ["train_dataset=reasoning_gym:basic_arithmetic"])
    assert job.train_dataset == "reasoning_gym:basic_arithmetic"
    with pytest.raises(ValueError, match="'train_dataset'.*str \\| dict"):
        load_config(RLJob, recipe, ["train_dataset=5"])


def test_the_command_line_reports_a_bad_task_before_loading_a_model(tmp_path, capsys):
    assert (
        main(
            [
                "rl",
                "model=/no/such/model",
                "train_dataset=reasoning_gym:leg_countin",
                "reward_funcs=[reasoning_gym]",
                f"output_dir={tmp_path / 'run'}",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train_dataset" in err and "'leg_counting'" in err


def test_a_tiny_run_records_its_mapping_and_reruns_from_the_record(tiny_model_dir, tmp_path):
    import torch

    from rlhfkit.config import RLConfig
    from rlhfkit.trainers import RLTrainer

    torch.set_num_threads(1)
    source = {"reasoning_gym": "basic_arithmetic", "size": 8, "system_prompt": None, "config": SMALL}
    args = RLConfig(
        algorithm="grpo",
        max_steps=1,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=8,
        output_dir=str(tmp_path / "run"),
    )
    history = RLTrainer(
        tiny_model_dir, ["reasoning_gym"], args, train_dataset=source, eval_dataset={**source, "size": 4}
    ).train()
    assert "reward/reasoning_gym_mean" in history[-1] and "eval/reasoning_gym_mean" in history[-1]
    job = load_config(RLJob, tmp_path / "run" / "config.yaml")
    assert job.train_dataset == source and job.eval_dataset == {**source, "size": 4}
    assert (
        main(["rl", "--config", str(tmp_path / "run" / "config.yaml"), f"output_dir={tmp_path / 'rerun'}", "--quiet"])
        == 0
    )


# ---------------------------------------------------------------- errors
def test_an_unknown_task_names_the_closest_ones_and_the_source():
    message = one_line_error("reasoning_gym:basic_arithmetc", name="eval dataset")
    assert message.startswith("eval dataset 'reasoning_gym:basic_arithmetc'")
    assert "Did you mean 'basic_arithmetic'" in message
    message = one_line_error({"reasoning_gym": {"leg_counting": 1, "gsm_symbolc": 1}})
    assert "'gsm_symbolc'" in message and "'gsm_symbolic'" in message
    assert "Tasks: ab, acre," in one_line_error("reasoning_gym:qqqqzzzz")  # nothing close: every name


def test_reasoning_gym_not_installed_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym raises ImportError
    message = one_line_error("reasoning_gym:leg_counting")
    assert "reasoning-gym is not installed" in message and "pip install 'rlhfkit[reasoning-gym]'" in message


def test_bad_options_and_keys_name_the_task_and_the_option():
    message = one_line_error({"reasoning_gym": "basic_arithmetic", "config": {"min_term": 2}})
    assert "task 'basic_arithmetic' has no option 'min_term'" in message and "'min_terms'" in message
    message = one_line_error({"reasoning_gym": "basic_arithmetic", "config": {"min_terms": 0}})
    assert "task 'basic_arithmetic' refused its options" in message and "min_terms must be positive" in message
    assert "'size'" in one_line_error({"reasoning_gym": "basic_arithmetic", "sise": 3})
    assert "'size'" in one_line_error({"reasoning_gym": "basic_arithmetic", "size": 0})
    assert "'seed'" in one_line_error({"reasoning_gym": "basic_arithmetic", "seed": -1})
    assert "'default'" in one_line_error({"reasoning_gym": "basic_arithmetic", "system_prompt": "defualt"})
    assert "'reasoning_gym'" in one_line_error({"reasoning_gm": "basic_arithmetic"})
    assert "weight of task 'leg_counting'" in one_line_error({"reasoning_gym": {"leg_counting": 0}})


# ---------------------------------------------------------------- the reward
def test_the_checker_gets_the_exact_entry_of_each_row():
    rows = load_prompt_dataset({"reasoning_gym": "basic_arithmetic", "size": 4, "seed": 1})
    answers = [row["reasoning_gym_entry"]["answer"] for row in rows]
    assert len(set(answers)) == 4
    right = [f"Thinking... <answer>{a}</answer>" for a in answers]
    assert score(rows, right) == [1.0] * 4
    shifted = right[1:] + right[:1]  # row i answered with row i+1's answer
    assert all(s < 1.0 for s in score(rows, shifted))
    as_chat = [[{"role": "assistant", "content": c}] for c in right]
    assert score(rows, as_chat) == [1.0] * 4
    assert score(rows, [a for a in answers]) == [0.0] * 4  # no <answer> tag: no answer
    other = {"reasoning_gym_task": [None] * 4, "reasoning_gym_entry": [None] * 4}
    assert score(rows, right, **other) == [None] * 4  # rows of another dataset: the reward does not apply


def test_the_checker_is_configured_like_the_generator():
    options = {"min_num_decimal_places": 1, "max_num_decimal_places": 1}  # its checker's tolerance: 0.1
    rows = load_prompt_dataset({"reasoning_gym": "decimal_arithmetic", "size": 2, "config": options})
    from decimal import Decimal

    near = [f"<answer>{Decimal(row['reasoning_gym_entry']['answer']) + Decimal('0.05')}</answer>" for row in rows]
    assert score(rows, near) == [1.0, 1.0]
    assert score(rows, near, reasoning_gym_config=[None, None]) == [0.0, 0.0]  # the default tolerance: 0.001


def test_the_reward_by_name_in_a_combination_and_without_its_columns():
    rows = load_prompt_dataset({"reasoning_gym": "leg_counting", "size": 2})
    columns = {k: [row[k] for row in rows] for k in rg_data.COLUMNS}
    out = RewardFunctions(["reasoning_gym"])([r["prompt"] for r in rows], ["<answer>-1</answer>"] * 2, columns)
    assert out.per_function["reasoning_gym"].tolist() == [0.0, 0.0] and out.valid.all()
    with pytest.raises(ValueError, match="needs rows of a reasoning-gym dataset"):
        RewardFunctions(["reasoning_gym"])(["q"], ["a"], {"answer": ["1"]})


# ---------------------------------------------------------------- train / eval
def test_the_same_source_as_train_and_eval_gives_disjoint_sets():
    source = {"reasoning_gym": "basic_arithmetic", "size": 50, "seed": 4}
    train = load_prompt_dataset(source)
    evaluation = load_prompt_dataset(source, name="eval dataset", train_rows=train)
    assert not set(questions(train)) & set(questions(evaluation))
    import reasoning_gym

    drawn = reasoning_gym.create_dataset("basic_arithmetic", size=50, seed=4 + rg_data.EVAL_SEED_OFFSET)
    assert questions(evaluation) == [entry["question"] for entry in drawn]


def test_questions_of_the_training_set_are_dropped_from_a_small_eval_set():
    source = {"reasoning_gym": "basic_arithmetic", "size": 200, "config": SMALL}
    train = load_prompt_dataset(source)
    dropped = r"^eval dataset reasoning_gym:basic_arithmetic: dropped \d+ of its 100 .*task basic_arithmetic"
    with pytest.warns(UserWarning, match=dropped):
        evaluation = load_prompt_dataset({**source, "size": 100}, name="eval dataset", train_rows=train)
    assert 0 < len(evaluation) < 100 and not set(questions(train)) & set(questions(evaluation))
    other = load_prompt_dataset("reasoning_gym:leg_counting")  # another training set: nothing of the first is dropped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_prompt_dataset({**source, "size": 100}, name="eval dataset", train_rows=other)) == 100
    tiny = {"reasoning_gym": "count_bits", "size": 50, "config": {"min_n": 1, "max_n": 4}}  # 4 questions in all
    message = one_line_error({**tiny, "size": 5}, name="eval dataset", train_rows=load_prompt_dataset(tiny))
    assert "every one of its 5 questions is also in the training set (task count_bits)" in message


# ---------------------------------------------------------------- mixes
def test_a_weighted_mix_draws_every_task_and_scores_each_row_with_its_own():
    source = {
        "reasoning_gym": {"leg_counting": 1.0, "basic_arithmetic": 3.0},
        "size": 60,
        "seed": 2,
        "config": {"basic_arithmetic": SMALL},
    }
    rows = load_prompt_dataset(source)
    tasks = [row["reasoning_gym_task"] for row in rows]
    assert tasks.count("basic_arithmetic") > tasks.count("leg_counting") > 0
    assert all(row["reasoning_gym_entry"]["metadata"]["source_dataset"] == row["reasoning_gym_task"] for row in rows)
    assert all(
        row["reasoning_gym_config"] == (SMALL if row["reasoning_gym_task"] == "basic_arithmetic" else {})
        for row in rows
    )
    assert score(rows, [f"<answer>{r['reasoning_gym_entry']['answer']}</answer>" for r in rows]) == [1.0] * 60
    message = one_line_error({**source, "config": {"leg_countin": {}}})
    assert "'leg_countin', which is not in the mix" in message
