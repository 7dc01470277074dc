"""TRL's on-policy distillation script with only the import changed (``from trl import`` -> ``from rlhfkit.trl
import``): ``DistillationConfig``'s fields, defaults and checks (TRL 1.16's), its one translation table to
``RLConfig``, one-line refusals of what rlhfkit cannot honour, and ``DistillationTrainer``'s interface: ``train()`` ->
``TrainOutput``, ``state.log_history`` with TRL's keys, ``save_model``, the teacher as a directory or an object.
Parity with TRL itself: tests/trl_parity/test_distillation_parity.py."""

import pytest
import torch

from rlhfkit.tasks.tiny import save_tiny_model
from rlhfkit.trl import DistillationConfig, DistillationTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = dict(use_cpu=True, bf16=False, report_to="none")  # TRL itself refuses bf16 on a CPU-only machine
PROMPTS = [{"prompt": p} for p in ["abc", "hello", "xyz", "qq", "go", "hi"]]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return save_tiny_model(root / "student", seed=0), save_tiny_model(root / "teacher", seed=1)


def test_the_defaults_are_trls():
    """TRL 1.16's DistillationConfig defaults (trl/trainer/distillation_config.py and base_config.py)."""
    c = DistillationConfig(output_dir="out", use_cpu=True)
    want = dict(
        learning_rate=1e-6,
        logging_steps=10,
        gradient_checkpointing=True,
        bf16=True,
        beta=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        max_completion_length=512,
        remove_unused_columns=False,
        shuffle_dataset=True,
        pad_to_multiple_of=None,  # "auto": 128 on Neuron only
        use_vllm=False,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,
        disable_dropout=False,
        max_tool_calling_iterations=None,
        teacher_model_init_kwargs=None,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
    )
    assert {k: getattr(c, k) for k in want} == want
    with pytest.raises(TypeError):  # a GRPO field is no DistillationConfig field, as in TRL
        DistillationConfig(output_dir="out", num_generations=2)


def test_beta_outside_0_1_is_refused_in_trls_words():
    with pytest.raises(ValueError, match=r"^beta must be in \[0.0, 1.0\], got 1.5.$"):
        DistillationConfig(output_dir="out", beta=1.5, **CPU)


def test_the_translation_table():
    c = DistillationConfig(
        output_dir="out",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        beta=0.25,
        temperature=0.7,
        top_k=5,
        min_p=0.1,
        max_completion_length=9,
        model_init_kwargs={"dtype": "bfloat16"},
        num_train_epochs=2,
        **CPU,
    )
    r = c.to_rlhfkit(13)
    got = {
        k: getattr(r, k)
        for k in (
            "algorithm",
            "distillation_mode",
            "distillation_coef",
            "distillation_beta",
            "group_size",
            "prompts_per_step",
            "mini_batch_size",
            "micro_batch_size",
            "num_iterations",
            "loss_agg",
            "kl_coef",
            "temperature",
            "top_k",
            "min_p",
            "max_new_tokens",
            "rollout_is",
            "dtype",
            "max_steps",
            "learning_rate",
        )
    }
    assert got == dict(
        algorithm="distill",
        distillation_mode="full",
        distillation_coef=1.0,
        distillation_beta=0.25,
        group_size=1,
        prompts_per_step=6,  # a generation batch: per device x accumulation (x processes)
        mini_batch_size=6,  # one optimizer step per generation batch
        micro_batch_size=2,
        num_iterations=1,
        loss_agg="token-mean",  # TRL's num_items_in_batch: the step's completion tokens
        kl_coef=0.0,
        temperature=0.7,
        top_k=5,
        min_p=0.1,
        max_new_tokens=9,
        rollout_is="none",
        dtype="bfloat16",
        max_steps=4,  # 13 prompts: 2 whole generation batches an epoch (TRL drops the last 1), 2 epochs
        learning_rate=1e-6,
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("generation_kwargs", {"num_beams": 2}),
        ("cache_implementation", "static"),
        ("vllm_mode", "server"),
        ("vllm_server_port", 8001),
        ("vllm_tensor_parallel_size", 2),
        ("teacher_model_revision", "v2"),
        ("shuffle_dataset", False),
        ("eval_strategy", "steps"),
        ("use_liger_kernel", True),
    ],
)
def test_what_rlhfkit_cannot_honour_is_refused_in_one_line_naming_it(field, value):
    c = DistillationConfig(output_dir="out", **CPU, **{field: value})
    with pytest.raises(ValueError, match=rf"^DistillationConfig field '{field}'=.*not supported by rlhfkit[^\n]*$"):
        c.to_rlhfkit(8)


def test_the_teachers_init_kwargs_take_the_students_dtype_only(dirs):
    c = DistillationConfig(output_dir="out", teacher_model_init_kwargs={"dtype": "float32"}, **CPU)
    assert c.teacher_source(dirs[1]) == dirs[1]
    c = DistillationConfig(output_dir="out", teacher_model_init_kwargs={"dtype": "bfloat16"}, **CPU)
    with pytest.raises(ValueError, match=r"^DistillationConfig field 'teacher_model_init_kwargs'=.*float32"):
        c.teacher_source(dirs[1])
    with pytest.raises(ValueError, match="already instantiated"):  # TRL's refusal
        c.teacher_source(torch.nn.Linear(1, 1))


def test_trainer_arguments_rlhfkit_cannot_honour_are_refused(dirs, tmp_path):
    args = DistillationConfig(output_dir=str(tmp_path / "o"), max_steps=1, **CPU)
    with pytest.raises(ValueError, match="^DistillationTrainer: teacher_model is required"):
        DistillationTrainer(dirs[0], None, args, PROMPTS)
    with pytest.raises(ValueError, match="^DistillationTrainer: quantization_config is not supported"):
        DistillationTrainer(dirs[0], dirs[1], args, PROMPTS, quantization_config=object())
    with pytest.raises(ValueError, match="optimizers=.*not supported by rlhfkit"):
        DistillationTrainer(dirs[0], dirs[1], args, PROMPTS, optimizers=(object(), None))


def test_two_steps_give_trls_interface(dirs, tmp_path):
    """A TRL distillation script (a teacher model object here), two optimizer steps of 2 x 2 accumulated prompts:
    TRL's TrainOutput, log_history rows with TRL's keys (loss = the logged divergence), the summary last, and
    save_model's directory loads as the trained student."""
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(dirs[1])
    args = DistillationConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=2,
        logging_steps=1,
        max_completion_length=6,
        learning_rate=1e-3,
        temperature=0.8,
        **CPU,
    )
    trainer = DistillationTrainer(model=dirs[0], teacher_model=teacher, args=args, train_dataset=PROMPTS)
    assert trainer.teacher_model is not None and trainer.args is args
    output = trainer.train()
    assert output.global_step == trainer.state.global_step == 2
    rows = trainer.state.log_history
    assert [r["step"] for r in rows] == [1, 2, 2]
    keys = {"loss", "grad_norm", "learning_rate", "entropy", "epoch", "completions/mean_length"}
    keys |= {"completions/max_length", "completions/clipped_ratio"}
    assert all(keys <= set(r) for r in rows[:2])
    assert [r["loss"] for r in rows[:2]] == [r["distill/divergence"] for r in trainer.history]
    assert all(r["loss"] > 0 for r in rows[:2])
    assert output.training_loss == pytest.approx(sum(r["loss"] for r in rows[:2]) / 2)
    assert {"train_runtime", "train_loss", "step"} <= set(rows[-1]) and "loss" not in rows[-1]
    trainer.save_model(str(tmp_path / "saved"))
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert all(
        torch.equal(a, b) for a, b in zip(saved.state_dict().values(), trainer.models.policy.state_dict().values())
    )
    with pytest.raises(ValueError, match=r"^DistillationTrainer.evaluate\(\) is not supported by rlhfkit"):
        trainer.evaluate()
