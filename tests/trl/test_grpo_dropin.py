"""TRL's GRPO and RLOO scripts with only the import changed (``from trl import`` -> ``from
rlhfkit.trl import``): TRL's config fields, defaults and batch arithmetic, TRL's trainer interface
(``trainer.state.global_step``, ``train()`` -> ``TrainOutput``, ``save_model``), and a one-line
refusal for every TRL field rlhfkit does not support."""

import dataclasses

import pytest
import torch

from rlhfkit.config import RLConfig
from rlhfkit.tasks.tiny import chatml_tokenizer, save_tiny_model
from rlhfkit.trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer
from rlhfkit.trl.arguments import NO_EFFECT, TRANSLATED

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = dict(use_cpu=True, bf16=False, report_to="none")  # TRL itself refuses bf16 on a CPU-only machine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def reward_len(completions, **kwargs):
    """TRL's quickstart reward: completions close to 8 characters."""
    return [-abs(8 - len(completion)) for completion in completions]


def test_trl_quickstart_runs_with_only_the_import_changed(model_dir, tmp_path):
    """TRL's GRPO quickstart (docs: "Quick start"), on a local tiny model and dataset."""
    dataset = [{"prompt": p} for p in ["abc", "hello", "xyz", "qq", "go", "hi"]]
    training_args = GRPOConfig(
        output_dir=str(tmp_path / "Qwen2-0.5B-GRPO"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        **CPU,
    )
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward_len, args=training_args, train_dataset=dataset)
    output = trainer.train()
    assert output.global_step == trainer.state.global_step == 2
    assert isinstance(output.training_loss, float) and "reward/mean" in output.metrics
    trainer.save_model(str(tmp_path / "saved"))
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert all(
        torch.equal(a, b) for a, b in zip(saved.state_dict().values(), trainer.models.policy.state_dict().values())
    )


@pytest.mark.parametrize(
    "per_device, accumulation, per_generation, iterations, world",
    [(8, 1, None, 1, 1), (2, 2, 4, 2, 1), (4, 1, 2, 1, 2), (2, 4, 8, 3, 2)],
)
def test_the_batch_arithmetic_is_trls(per_device, accumulation, per_generation, iterations, world, monkeypatch):
    """A TRL config and its translation: the same completions per generation and per optimizer step,
    the same micro-batch, and the same optimizer steps per generation."""
    from rlhfkit import distributed

    monkeypatch.setattr(distributed, "planned_world", lambda: world)  # torchrun's WORLD_SIZE, without a group
    config = GRPOConfig(
        output_dir="out",
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=per_generation,
        num_iterations=iterations,
        num_generations=2,
        max_steps=10 * iterations * 8,
        **CPU,
    )
    ours = config.to_rlhfkit(n_rows=100, world=world)
    spg = per_generation or accumulation
    assert ours.batch_size == per_device * world * spg == config.generation_batch_size  # completions per generation
    assert ours.mini_batch_size == per_device * world * accumulation  # completions per optimizer step
    assert ours.micro_batch_size == per_device  # per process per forward/backward
    steps_per_generation = ours.num_iterations * ours.batch_size // ours.mini_batch_size
    assert steps_per_generation == iterations * spg // accumulation == config.optimizer_steps_per_generation
    assert ours.max_steps * steps_per_generation == config.max_steps  # max_steps counts optimizer steps


def test_optimizer_steps_per_generation_are_trls_in_a_run(model_dir, tmp_path):
    """steps_per_generation=4 micro-steps of 2 completions, accumulation 2, two passes: 4 optimizer
    steps per generation, each on 4 completions."""
    config = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        num_iterations=2,
        num_generations=4,
        max_completion_length=4,
        max_steps=8,
        **CPU,
    )
    trainer = GRPOTrainer(model_dir, reward_len, config, [{"prompt": p} for p in ["abc", "hello", "xyz", "qq"]])
    rows = trainer.train()
    assert trainer.state.global_step == 8 and len(trainer.history) == 2  # 2 generations x 4 optimizer steps
    assert trainer.config.prompts_per_step == 2 and trainer.config.mini_batch_size == 4
    assert rows.metrics["perf/lr"] < config.learning_rate  # TRL's default linear decay over the 8 optimizer steps


def test_trls_defaults_are_kept():
    config = GRPOConfig(output_dir="out", **CPU)
    ours = config.to_rlhfkit(n_rows=64)
    assert (ours.learning_rate, ours.group_size, ours.max_new_tokens, ours.kl_coef, ours.seed) == (
        1e-6,
        8,
        512,
        0.0,
        42,
    )
    assert (ours.loss_agg, ours.advantage_estimator, ours.clip_low, ours.clip_high) == ("token-mean", "group", 0.2, 0.2)
    assert ours.gradient_checkpointing and ours.lr_scheduler == "hf_linear" and ours.log_every == 10
    assert ours.max_steps == 3 * 64 // 1  # 3 epochs of 64 prompts, one prompt (8 completions) per generation
    rloo = RLOOConfig(output_dir="out", **CPU).to_rlhfkit(n_rows=64)
    assert (rloo.group_size, rloo.kl_coef, rloo.kl_in_reward, rloo.advantage_estimator) == (2, 0.05, True, "rloo")


def test_trls_rules_are_selected_where_rlhfkits_own_differ():
    """The translation picks TRL's semantics (each checked against TRL itself in tests/trl_parity)."""
    ours = GRPOConfig(output_dir="out", **CPU, use_vllm=True).to_rlhfkit(n_rows=64)
    assert ours.entropy_agg == "micro-batch-token-mean" and ours.masked_rows_count and ours.unscored_in_loss
    assert ours.drop_last and ours.rollout_is_zero_masked
    assert (ours.rollout_is, ours.rollout_is_threshold, ours.rollout_is_threshold_low) == ("sequence_mask", 3.0, 0.0)
    uncapped = GRPOConfig(output_dir="out", **CPU, use_vllm=True, vllm_importance_sampling_clip_max=None)
    assert uncapped.to_rlhfkit(n_rows=64).rollout_is_threshold is None  # TRL: no cap (it was 2.0)
    assert GRPOConfig(output_dir="out", **CPU, max_grad_norm=0).to_rlhfkit(n_rows=64).max_grad_norm is None
    assert RLOOConfig(output_dir="out", **CPU, use_vllm=True).to_rlhfkit(n_rows=64).rollout_is == "none"  # TRL's RLOO


@pytest.mark.parametrize("other", [dict(algorithm="dapo"), dict(rollout_workers=1)])
def test_unscored_rows_in_the_loss_are_refused_beside_filler_rows(other):
    """Dynamic sampling and generator ranks fill a step with unscored rows that must stay out of the loss."""
    with pytest.raises(ValueError, match="'unscored_in_loss' must be False with dynamic_sampling or rollout_workers"):
        RLConfig(**{"algorithm": "grpo", **other}, unscored_in_loss=True)


@pytest.mark.parametrize("epsilon_high, cap", [(None, 0.2), (0.28, 0.28), (5.0, 5.0)])
def test_cispo_caps_the_ratio_at_epsilon_high_as_trl(epsilon_high, cap):
    """TRL's CISPO weight is min(ratio, epsilon_high) (epsilon_high defaults to epsilon, 0.2); rlhfkit's
    is min(ratio, 1 + clip_high). The default used to be refused ('clip_high' must be > 0, got -0.8)."""
    ours = GRPOConfig(output_dir="out", **CPU, loss_type="cispo", epsilon_high=epsilon_high).to_rlhfkit(n_rows=8)
    assert ours.policy_loss == "cispo" and abs(1 + ours.clip_high - cap) < 1e-12


@pytest.mark.parametrize("epochs, steps", [(1, 2), (3, 6), (1.5, 3)])
def test_epochs_count_whole_generations_as_trl(epochs, steps):
    """10 prompts, 4 per generation: TRL drops each epoch's incomplete last generation (2 an epoch,
    where rlhfkit used to run 3), and takes ceil(epochs x steps per epoch) optimizer steps."""
    config = GRPOConfig(
        output_dir="out", **CPU, per_device_train_batch_size=8, num_generations=2, num_train_epochs=epochs
    )
    assert config.to_rlhfkit(n_rows=10).max_steps == steps
    with pytest.raises(ValueError, match="fewer than one generation takes"):
        config.to_rlhfkit(n_rows=3)


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("deepspeed", "ds.json", "torchrun"),
        ("use_liger_kernel", True, "Liger"),
        ("push_to_hub", True, "save_model"),
        ("delta", 1.1, "below 1 + epsilon_high"),
        ("cast_lm_head_to_fp32", True, "only its default"),
        ("sync_ref_model", True, "kl_coef is 0"),  # beta 0: no reference to synchronise
        ("vllm_mode", "server", "rollout_workers"),
        ("generation_kwargs", {"num_beams": 2}, "only its default"),
        ("torch_compile", True, "compiled"),
        ("loss_type", "gspo", "'dapo'"),
        ("scale_rewards", "median", "'group'"),
        ("shuffle_dataset", False, "seeded shuffle"),
        ("num_generations", None, "completions per prompt"),  # TRL's own check fails on it with a TypeError
    ],
)
def test_an_unsupported_field_is_refused_in_one_line_naming_it(field, value, says):
    with pytest.raises(ValueError) as err:
        GRPOConfig(output_dir="out", **{**CPU, field: value}).to_rlhfkit(n_rows=8)
    message = str(err.value)
    assert "\n" not in message and repr(field) in message and says in message


def test_every_field_is_translated_without_effect_or_refused():
    """No field is silently ignored: each GRPOConfig field is in one of the three lists, or is
    refused when it leaves its default (checked above for a sample; here, that the lists name real
    fields, so a typo in them cannot let a field through)."""
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert (GRPOConfig.HANDLED | TRANSLATED) <= names
    assert not (NO_EFFECT - names - {"dataset_num_proc"})  # a supervised-config field, listed once for all


def test_rloo_runs_with_only_the_import_changed(model_dir, tmp_path):
    config = RLOOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        max_steps=1,
        **CPU,
    )
    trainer = RLOOTrainer(
        model=model_dir, reward_funcs=reward_len, args=config, train_dataset=[{"prompt": p} for p in ["abc", "hello"]]
    )
    assert trainer.train().global_step == 1 and trainer.config.algorithm == "rloo"


def test_tools_example_runs(tmp_path):
    """TRL's tools example shape: GRPOTrainer(tools=[fn]) on a chat model whose template lists tools."""
    from rlhfkit.tasks.calculator_demo import TINY_TOOLS_TEMPLATE

    tok = chatml_tokenizer()
    tok.chat_template = TINY_TOOLS_TEMPLATE
    model = save_tiny_model(tmp_path / "chat", tokenizer=tok, seed=0)

    def multiply(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a * b

    dataset = [{"prompt": [{"role": "user", "content": "2*3?"}]}, {"prompt": [{"role": "user", "content": "4*5?"}]}]
    config = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=16,
        max_steps=1,
        max_tool_calling_iterations=2,
        **CPU,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward_len, args=config, train_dataset=dataset, tools=[multiply])
    assert trainer.train().global_step == 1
    assert "agent/turns_mean" in trainer.history[-1]


def test_conversational_quickstart_with_trls_reward_contract(tmp_path):
    """TRL's conversational example: prompts are message lists, each completion reaches the reward
    function as ``[{"role": "assistant", "content": ...}]`` (``completion[0]["content"]``)."""
    model = save_tiny_model(tmp_path / "chat", tokenizer=chatml_tokenizer(), seed=0)
    seen = []

    def reward_num_unique_letters(completions, **kwargs):
        """TRL docs' example reward: the number of distinct characters of each completion."""
        seen.extend(completions)
        completion_contents = [completion[0]["content"] for completion in completions]
        return [float(len(set(content))) for content in completion_contents]

    dataset = [{"prompt": [{"role": "user", "content": q}]} for q in ("Hi?", "Why?")]
    config = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        max_steps=1,
        **CPU,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward_num_unique_letters, args=config, train_dataset=dataset)
    assert trainer.train().global_step == 1
    assert len(seen) == 4 and all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in seen)


def test_reward_functions_see_trls_global_step_in_optimizer_steps(model_dir, tmp_path):
    """TRL passes ``trainer_state`` (its ``self.state``): ``global_step`` counts optimizer steps,
    here 2 per generation (num_iterations=2)."""
    seen = []

    def reward(completions, trainer_state, **kwargs):
        seen.append((trainer_state.global_step, trainer_state.max_steps))
        return [0.0] * len(completions)

    config = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        num_iterations=2,
        max_completion_length=4,
        max_steps=4,
        **CPU,
    )
    GRPOTrainer(model_dir, reward, config, [{"prompt": p} for p in ["abc", "hello"]]).train()
    assert seen == [(0, 4), (2, 4)]


def test_a_trl_training_test_body_runs_unchanged(model_dir, tmp_path):
    """The shape of TRL's own GRPO training tests: snapshot ``trainer.model``'s parameters, train, read
    ``log_history[-1]["train_loss"]``, check every parameter moved (``trainer.model.get_parameter``)."""
    dataset = [{"prompt": p} for p in ["abc", "hello", "xyz", "qq", "go", "hi"]]
    training_args = GRPOConfig(
        output_dir=str(tmp_path), learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
        max_completion_length=8, max_steps=2, **CPU,
    )  # fmt: skip
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward_len, args=training_args, train_dataset=dataset)
    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    for n, param in previous_trainable_params.items():
        new_param = trainer.model.get_parameter(n)
        assert not torch.equal(param, new_param), f"Parameter {n} has not changed."


def test_trl_s_argument_parser_builds_the_config_from_a_command_line():
    # TRL's scripts parse their config with HfArgumentParser (TrlParser): the fields keep TRL's annotations
    # (scale_rewards a str), and what the parser gives for an unset field (debug None, not '') is no setting
    from transformers import HfArgumentParser

    argv = ["--output_dir", "out", "--scale_rewards", "batch", "--bf16", "False", "--num_generations", "4"]
    (args,) = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses(argv)
    assert args.scale_rewards == "batch" and args.num_generations == 4
