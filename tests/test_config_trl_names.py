"""The command line's "did you mean" knows TRL's field names (rlhfkit/config/trl_names.py, the
drop-in's name tables): a TRL name is answered with rlhfkit's, not with a look-alike field."""

from __future__ import annotations

import pytest

from rlhfkit.cli import main
from rlhfkit.config.io import load_config
from rlhfkit.config.jobs import DPOJob, RLJob, SFTJob


@pytest.mark.parametrize(
    "command, key, ours",
    [
        ("rl", "num_generations", "group_size"),  # was: Did you mean 'num_iterations'?
        ("rl", "max_completion_length", "max_new_tokens"),  # was: Did you mean 'max_prompt_length'?
        ("rl", "beta", "kl_coef"),  # was: nothing
        ("rl", "logging_steps", "log_every"),
        ("rl", "epsilon", "clip_low"),
        ("rl", "use_vllm", "rollout_engine=vllm"),
        ("sft", "gradient_accumulation_steps", "grad_accumulation"),
        ("dpo", "precompute_ref_log_probs", "precompute_ref_logprobs"),
    ],
)
def test_a_trl_name_on_the_command_line_is_answered_with_rlhfkits(command, key, ours, capsys):
    assert main([command, f"{key}=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"unknown config key {key!r} from the command line. {key!r} is TRL's name: rlhfkit's is {ours}" in err, err
    assert "Did you mean" not in err


def test_the_public_parser_says_it_for_a_yaml_file_too(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("num_generations: 4\n")
    with pytest.raises(
        ValueError,
        match=r"from file .*recipe\.yaml\. 'num_generations' is TRL's name: rlhfkit's is "
        r"group_size\.$",
    ):
        load_config(RLJob, recipe)


def test_a_trl_name_is_answered_only_where_its_rlhfkit_field_exists():
    # beta is DPO's own field (no error); RL's kl_coef is no SFT field, so SFT falls back to difflib
    assert load_config(DPOJob, None, ["beta=0.2"]).beta == 0.2
    with pytest.raises(ValueError) as e:
        load_config(SFTJob, None, ["beta=0.2"])
    assert "TRL's name" not in str(e.value)
    with pytest.raises(ValueError, match="'per_device_train_batch_size' is TRL's name: rlhfkit's is micro_batch_size"):
        load_config(RLJob, None, ["per_device_train_batch_size=2"])
    with pytest.raises(ValueError, match="'per_device_train_batch_size' is TRL's name: rlhfkit's is batch_size"):
        load_config(SFTJob, None, ["per_device_train_batch_size=2"])


def test_an_unknown_key_that_is_no_trl_name_still_gets_close_matches():
    with pytest.raises(ValueError, match="Did you mean 'kl_coef'"):
        load_config(RLJob, None, ["kl_cof=0.1"])


def test_each_table_names_fields_the_configs_declare():
    """The tables spell rlhfkit's side by the config's own field names (declared once, in rlhfkit/config/)."""
    import dataclasses

    from rlhfkit.config import RLConfig
    from rlhfkit.config.supervised import DPOConfig, RewardModelConfig, SFTConfig
    from rlhfkit.config.trl_names import DPO_NAMES, RL_NAMES, SUPERVISED_NAMES, rlhfkit_field

    for table, configs in (
        (RL_NAMES, [RLConfig]),
        (SUPERVISED_NAMES, [SFTConfig, RewardModelConfig, DPOConfig]),
        (DPO_NAMES, [DPOConfig]),
    ):
        for config in configs:
            fields = {f.name for f in dataclasses.fields(config)}
            assert not [t for t, spelling in table.items() if rlhfkit_field(spelling) not in fields], config


def test_help_names_a_fields_trl_names_under_its_doc():
    from rlhfkit.config import format_help

    def block(text: str, field: str) -> str:
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(f"  {field} ("))
        end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("   "))
        return "\n".join(lines[start:end])

    rl = format_help(RLJob)
    assert block(rl, "group_size").endswith("\n      TRL's name: num_generations.")
    assert block(rl, "rollout_engine").endswith("\n      TRL's name: use_vllm (rollout_engine=vllm).")
    assert "TRL's names: bf16 (autocast=bfloat16), fp16 (autocast=float16)." in block(rl, "autocast")
    assert "TRL's name" not in block(rl, "seed")  # the same name in TRL: nothing to say
    sft = format_help(SFTJob)
    assert block(sft, "grad_accumulation").endswith("TRL's name: gradient_accumulation_steps.")
    assert block(sft, "batch_size").endswith(
        "TRL's name: per_device_train_batch_size (rows per micro-step over all processes)."
    )
