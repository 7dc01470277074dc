"""The vLLM engine against the HF engine and the trainer, with a real vLLM (CPU build) engine.

Run by ``make test-vllm`` (its own environment, .venv-vllm); deselected from ``make test``.
"""

import pytest
import torch

from rlhfkit.models.policy import forward_response
from rlhfkit.rollout import HFEngine, SamplingParams

pytestmark = pytest.mark.vllm

NEAR_TIE = 1e-3  # where greedy outputs differ, the two best log-probs at the first difference are this close
SMOLLM2_LOGPROB_TOL = 1e-3  # 30 float32 layers in two kernel orders (measured: <= 4e-5)


@pytest.fixture(autouse=True)
def _threads(engine_threads):
    """Two threads alone, one per pytest-xdist worker (tests/conftest.py)."""


def tiny_policy(seed=0):
    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

    tok = char_tokenizer()
    return tiny_causal_lm(tok, heads=2, seed=seed), tok  # head size 32: vLLM's CPU attention needs >= 32


def make_engine(policy, tok, max_model_len=128, seed=0):
    from rlhfkit.rollout.vllm import VLLMEngine, hf_weights

    engine = VLLMEngine(policy, tok, max_model_len=max_model_len, seed=seed, kv_cache_gb=0.25)
    engine.sync_weights(hf_weights(policy), version=0)
    return engine


def encode(tok, texts, chat=False):
    from rlhfkit.data import render_prompt

    return [tok(render_prompt(t, tok) if chat else t, add_special_tokens=False)["input_ids"] for t in texts]


def assert_greedy_equal_or_near_tie(policy, prompts, hf, vl):
    """Row by row: equal token ids, or the first differing position was a near-tie for the model."""
    differing = 0
    for i in range(hf.input_ids.shape[0]):
        a = hf.response_ids[i][hf.response_mask[i].bool()].tolist()
        b = vl.response_ids[i][vl.response_mask[i].bool()].tolist()
        if a == b:
            continue
        differing += 1
        k = next(j for j in range(min(len(a), len(b)) + 1) if j == min(len(a), len(b)) or a[j] != b[j])
        ids = torch.tensor([list(prompts[i]) + a[:k]])
        with torch.no_grad():
            logits = policy(input_ids=ids).logits[0, -1].float().log_softmax(-1)
        top = logits.topk(2).values
        assert (top[0] - top[1]).item() < NEAR_TIE, (i, k, a, b, top.tolist())
    return differing


def test_greedy_completions_equal_hf_on_smollm2():
    """A real checkpoint (SmolLM2-135M-Instruct: 30 layers, grouped-query attention, tied embeddings,
    RoPE theta 1e5), synced into a vLLM engine, decodes greedily what the HF model decodes greedily.

    HF's greedy completion is, by definition, the HF model's argmax at every position given the
    prefix. So each completion vLLM returns is checked with one teacher-forced HF forward over it
    (not HF's token-by-token ``generate``, ~30 CPU s of this test for the same comparison, which also
    stopped comparing a row at its first difference): every token vLLM chose is the HF argmax there
    (or a near-tie, which float32 kernels may break either way), a completion stops only at EOS or at
    the token budget, and the engine's log-prob of every token is the HF model's (vLLM reports the
    unwarped log-softmax under greedy). HFEngine.generate itself against vLLM: the tiny Llama test."""
    from rlhfkit.models import load_causal_lm, load_tokenizer
    from rlhfkit.models.sources import smollm2_gguf
    from rlhfkit.tasks.arithmetic import make_rows

    source = smollm2_gguf()
    policy, tok = load_causal_lm(source, "float32").eval(), load_tokenizer(source)
    prompts = encode(tok, [r["prompt"] for r in make_rows(4, 0)], chat=True)
    engine = make_engine(policy, tok, max_model_len=128)
    budget = 16
    vl = engine.generate(prompts, 1, SamplingParams(max_new_tokens=budget, greedy=True))
    near_ties, checked = 0, 0
    for i, prompt in enumerate(prompts):
        response = vl.response_ids[i][vl.response_mask[i].bool()]
        assert bool(vl.has_eos[i]) or len(response) == budget, (i, response.tolist())  # no early stop
        with torch.no_grad():  # position P-1+j predicts response token j
            logprobs = policy(input_ids=torch.tensor([list(prompt) + response.tolist()])).logits[0].float()
        logprobs = logprobs[len(prompt) - 1 : len(prompt) - 1 + len(response)].log_softmax(-1)
        chosen = logprobs.gather(1, response[:, None])[:, 0]
        behind = logprobs.max(-1).values - chosen  # 0 where vLLM's token is HF's argmax
        assert (behind < NEAR_TIE).all(), (i, behind.tolist(), response.tolist())
        near_ties += int((behind > 0).sum())
        gap = (chosen - vl.logprobs[i][: len(response)]).abs().max().item()
        assert gap < SMOLLM2_LOGPROB_TOL, (i, gap)
        checked += len(response)
    assert near_ties <= 2 and checked >= 3 * budget, (near_ties, checked)


@pytest.fixture(scope="module")
def tiny_engine():
    """One engine for every tiny-Llama test of this file (one config, tokenizer and length; an
    engine costs ~2 CPU s to build). Each test first syncs its own policy's weights into it
    (``synced``), which also drops the prefix cache, and seeds all its sampling, so no test sees
    another's weights or draws. Built after the SmolLM2 test's engine is gone: an engine that goes
    away while another is in use tears down vLLM's process-wide state (the untied engine's tests,
    last, only build theirs while this one is idle); gc first, so that no earlier engine goes away
    later."""
    import gc

    gc.collect()
    policy, tok = tiny_policy(seed=99)  # weights no test uses: each test's outcome rests on its own sync
    engine = make_engine(policy, tok)
    yield engine
    engine.close()


def synced(engine, policy, version=0):
    """``engine`` holding ``policy``'s weights (as ``make_engine`` builds it)."""
    from rlhfkit.rollout.vllm import hf_weights

    engine.sync_weights(hf_weights(policy), version=version)
    return engine


def test_greedy_completions_equal_hf_on_a_tiny_llama(tiny_engine):
    """HFEngine.generate and the vLLM engine decode the same greedy completions (a differing row
    only where the model had a near-tie)."""
    policy, tok = tiny_policy()
    policy.eval()
    prompts = encode(tok, ["abc", "hello", "xyz 12", "qq", "the cat", "go", "12+3=", "hi there"])
    engine = synced(tiny_engine, policy)
    sampling = SamplingParams(max_new_tokens=16, greedy=True)
    hf = HFEngine(policy, tok.pad_token_id, tok.eos_token_id).generate(prompts, 1, sampling)
    vl = engine.generate(prompts, 1, sampling)
    assert vl.input_ids.shape[0] == 8 and vl.logprobs.shape == vl.response_mask.shape
    assert assert_greedy_equal_or_near_tie(policy, prompts, hf, vl) <= 1


def trainer_logprobs(policy, rollout, temperature):
    with torch.no_grad():
        T = rollout.response_mask.shape[1]
        return forward_response(policy, rollout.input_ids, rollout.attention_mask, T, temperature).logprobs


def one_step(policy, tok, lr):
    """One AdamW step on a language-modelling loss over some text: the weights move."""
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    ids = torch.tensor([tok("the quick brown fox jumps over the lazy dog", add_special_tokens=False)["input_ids"]])
    policy.train()
    policy(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    policy.eval()


LOGPROB_TOL = 1e-4  # float32: both sides compute the same math in another order (vLLM's CPU kernels)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_match_the_trainer_after_a_sync_and_not_before(lora, temperature, tiny_engine):
    """The engine's log-prob of each sampled token is the trainer's (full model or LoRA merged):
    after a sync, not before it (one AdamW step later, the engine still holds the old weights)."""
    from rlhfkit.rollout.vllm import hf_weights

    policy, tok = tiny_policy(seed=1)
    if lora:
        from peft import LoraConfig, get_peft_model

        policy = get_peft_model(
            policy, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], lora_dropout=0.0)
        )
    policy.eval()
    engine = synced(tiny_engine, policy)
    prompts = encode(tok, ["abc", "hello", "xyz 12", "the cat"])
    sampling = SamplingParams(max_new_tokens=12, temperature=temperature)

    def gap(seed):
        rollout = engine.generate(prompts, 2, sampling, seed=seed)
        mask = rollout.response_mask.bool()
        return (trainer_logprobs(policy, rollout, temperature) - rollout.logprobs)[mask].abs().max().item()

    assert gap(11) < LOGPROB_TOL  # synced at build
    one_step(policy, tok, lr=0.05)
    before = gap(12)
    assert before > 100 * LOGPROB_TOL, before  # the engine still holds the old weights
    engine.sync_weights(hf_weights(policy), version=1)
    after = gap(13)
    assert after < LOGPROB_TOL, after
    assert engine.synced_version == 1


def test_the_same_seed_samples_the_same_completions_and_sampling_follows_the_config(tiny_engine):
    """A seed fixes the completions (another seed draws others); the engine's sampling parameters
    are the config's; top-k 1 samples with log-prob 0 (renormalised over the kept token)."""
    policy, tok = tiny_policy()
    engine = synced(tiny_engine, policy)
    prompts = encode(tok, ["abc", "hello"])
    sampling = SamplingParams(max_new_tokens=10, temperature=1.0)
    a, b = engine.generate(prompts, 4, sampling, seed=5), engine.generate(prompts, 4, sampling, seed=5)
    c = engine.generate(prompts, 4, sampling, seed=6)
    assert torch.equal(a.input_ids, b.input_ids) and not torch.equal(a.input_ids, c.input_ids)
    assert a.input_ids.shape[0] == 8 and a.prompt_index.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    params = engine.sampling_params(SamplingParams(max_new_tokens=7, temperature=0.7, top_p=0.9, top_k=0), 3, 1)
    assert (params.n, params.temperature, params.top_p, params.top_k, params.max_tokens, params.seed) == (
        3,
        0.7,
        0.9,
        -1,
        7,
        1,
    )
    # top-k limits each step to the k best tokens: every sampled token's engine log-prob is that of
    # a renormalised top-1 distribution, i.e. 0
    top1 = engine.generate(prompts, 2, SamplingParams(max_new_tokens=6, temperature=1.0, top_k=1), seed=1)
    assert top1.logprobs[top1.response_mask.bool()].abs().max() < 1e-5


def test_a_seeded_prompt_samples_the_same_whatever_shares_the_call(tiny_engine):
    """Per-prompt seeds (one per prompt, as the trainer passes them): a prompt's completions are the
    same with three other prompts in the call or alone — the trainer's prompts split over N
    processes or generator ranks sample what one process samples."""
    policy, tok = tiny_policy(seed=2)
    engine = synced(tiny_engine, policy)
    prompts, seeds = encode(tok, ["abc", "hello", "xyz 12", "the cat"]), [101, 202, 303, 404]
    sampling = SamplingParams(max_new_tokens=10, temperature=1.0)
    together = engine.generate(prompts, 3, sampling, seed=seeds)
    alone = engine.generate(prompts[2:3], 3, sampling, seed=seeds[2:3])
    rows = together.select(torch.arange(6, 9))
    ids = lambda r: [r.response_ids[i, : int(r.response_mask[i].sum())].tolist() for i in range(3)]  # noqa: E731
    assert ids(rows) == ids(alone)
    assert len({tuple(x) for x in ids(rows)}) > 1  # each completion draws from a stream of its own


def test_sleep_mode_tensor_parallelism_and_unsupported_head_sizes_are_refused_on_cpu_in_one_line():
    from rlhfkit.rollout.vllm import VLLMEngine
    from rlhfkit.tasks.tiny import tiny_causal_lm

    policy, tok = tiny_policy()
    with pytest.raises(ValueError, match="head sizes .* this model's is 16"):
        VLLMEngine(tiny_causal_lm(tok, heads=4), tok, max_model_len=64)
    with pytest.raises(ValueError, match="vllm_sleep=True needs a GPU"):
        VLLMEngine(policy, tok, max_model_len=64, sleep=True)
    with pytest.raises(ValueError, match="vllm_tensor_parallel_size=2"):
        VLLMEngine(policy, tok, max_model_len=64, tensor_parallel_size=2)


# Every adapter kind the engine takes merged (rlhfkit.rollout.weight_sync), on one untied Llama with
# biases (so LoRA on the embedding, modules_to_save on lm_head and lora_bias all apply).
ADAPTER_KINDS = {
    "lora": dict(target_modules=["q_proj", "v_proj", "up_proj"]),
    "dora": dict(target_modules=["q_proj", "down_proj"], use_dora=True),
    "rslora_alpha_pattern": dict(
        target_modules=["q_proj", "v_proj"], use_rslora=True, lora_alpha=16, alpha_pattern={"v_proj": 3}
    ),
    "embedding": dict(target_modules=["embed_tokens", "o_proj"]),
    "embedding_dora": dict(target_modules=["embed_tokens", "o_proj"], use_dora=True),
    "modules_to_save_lm_head": dict(target_modules=["q_proj"], modules_to_save=["lm_head"]),
    "lora_bias": dict(target_modules=["q_proj", "o_proj", "up_proj"], lora_bias=True),
    "trainable_tokens": dict(target_modules=["q_proj"], trainable_token_indices=list(range(3, 40))),
}


def untied_llama_with_biases(tok, seed=1):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        attention_bias=True,
        mlp_bias=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def untied_engine():
    from rlhfkit.tasks.tiny import char_tokenizer

    tok = char_tokenizer()
    engine = make_engine(untied_llama_with_biases(tok), tok, seed=3)
    yield engine, tok
    engine.close()


@pytest.mark.parametrize("kind", list(ADAPTER_KINDS))
def test_engine_logprobs_match_the_trainer_after_a_step_of_every_adapter_kind(kind, untied_engine):
    import warnings

    from peft import LoraConfig, get_peft_model

    from rlhfkit.rollout.vllm import hf_weights

    engine, tok = untied_engine
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = dict(r=4, lora_alpha=8, lora_dropout=0.0) | ADAPTER_KINDS[kind]
        policy = get_peft_model(untied_llama_with_biases(tok), LoraConfig(**options))
    one_step(policy, tok, lr=0.05)
    engine.sync_weights(hf_weights(policy), version=1)
    prompts = encode(tok, ["abc", "hello", "xyz 12", "the cat"])
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=1.0, top_k=0)
    rollout = engine.generate(prompts, 2, sampling, seed=7)
    mask = rollout.response_mask.bool()
    gap = (trainer_logprobs(policy, rollout, 1.0) - rollout.logprobs)[mask].abs().max().item()
    with policy.disable_adapter():
        moved = (trainer_logprobs(policy, rollout, 1.0) - rollout.logprobs)[mask].abs().max().item()
    assert moved > 100 * LOGPROB_TOL, moved  # the adapter's step changed what the engine samples from
    assert gap < LOGPROB_TOL, gap
