"""Models whose turns end with a token other than the tokenizer's EOS (Gemma 2's ``<end_of_turn>``
beside ``<eos>``, the first Llama 3 Instruct's ``<|eot_id|>``, Phi-3's ``<|end|>``): every engine
stops at the model's whole EOS set (``models.loading.eos_token_ids``, TRL 1.16's rule), and a
response ends at the first of them — the token kept in the response mask, as an EOS is."""

import pytest
import torch

from rlhfkit.models.loading import eos_token_ids
from rlhfkit.rollout import HFEngine, SamplingParams, build_rollout
from rlhfkit.rollout.base import decode_completions, response_mask_from_ids
from rlhfkit.tasks.tiny import chatml_tokenizer, tiny_causal_lm, tiny_turn_end_lm

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

END = "<|im_end|>"


@pytest.fixture
def tok():
    """ChatML whose turns end with <|im_end|> while the tokenizer's EOS is a separate <eos>."""
    return chatml_tokenizer(eos_token="<eos>")


def test_eos_token_ids_is_the_tokenizers_eos_plus_the_models(tok):
    eot = tok.convert_tokens_to_ids(END)
    model = tiny_causal_lm(tok, end_of_turn=END)
    assert model.generation_config.eos_token_id == [tok.eos_token_id, eot]
    assert eos_token_ids(tok, model) == (tok.eos_token_id, eot)
    model.generation_config.eos_token_id = eot  # an int
    assert eos_token_ids(tok, model) == (tok.eos_token_id, eot)  # the tokenizer's prepended, as TRL does
    model.generation_config.eos_token_id = None
    assert eos_token_ids(tok, model) == (tok.eos_token_id,)
    assert eos_token_ids(7) == (7,) and eos_token_ids([7, 8], 8, None, (9,)) == (7, 8, 9)  # an int is a set of one


def test_response_mask_ends_at_the_first_of_any_end_id():
    responses = torch.tensor([[7, 9, 8, 8], [7, 8, 0, 0], [7, 7, 7, 7]])
    mask, has_eos = response_mask_from_ids(responses, (8, 9))
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert has_eos.tolist() == [True, True, False]
    # build_rollout (the vLLM engine's layout) takes the set too; a single id still works
    r = build_rollout([[5, 6]], [[7, 9, 8, 8], [7, 8], [7, 7, 7]], 3, pad_id=0, eos_id=(8, 9))
    assert r.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert r.has_eos.tolist() == [True, True, False]
    assert build_rollout([[5, 6]], [[7, 9, 8]], 1, pad_id=0, eos_id=8).response_mask.tolist() == [[1, 1, 1]]


def test_hf_engine_stops_at_the_models_end_of_turn(tok):
    """The engine is given the tokenizer's EOS only (as every caller does); the model's own
    end-of-turn token ends the completion too: nothing is sampled after it, the mask ends on it,
    and the row counts as ended (``has_eos``), not truncated."""
    eot, max_new = tok.convert_tokens_to_ids(END), 12
    model = tiny_turn_end_lm(tok, seed=0).eval()
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("hello", "12+3=", "x")]
    r = engine.generate(prompts, 4, SamplingParams(max_new_tokens=max_new), seed=3)
    T, ends = r.response_mask.shape[1], {tok.eos_token_id, eot}
    ended_by_eot = 0
    for i, row in enumerate(r.response_ids.tolist()):
        first = next((k for k, t in enumerate(row) if t in ends), None)
        if first is None:  # cut at the limit
            assert T == max_new and r.response_mask[i].tolist() == [1] * T and not r.has_eos[i]
            continue
        ended_by_eot += row[first] == eot
        assert r.response_mask[i].tolist() == [1] * (first + 1) + [0] * (T - first - 1), row
        assert bool(r.has_eos[i]), row
        assert all(t == tok.pad_token_id for t in row[first + 1 :]), f"sampled past the end of the turn: {row}"
    assert ended_by_eot >= 2, r.response_ids.tolist()  # the seed makes the case happen
    assert not bool(r.has_eos.all())  # and some rows are cut, so both kinds are checked
    # the decoded completion stops before the end of turn, as before an EOS
    text = decode_completions(r, tok)
    assert all(END not in t and "<eos>" not in t for t in text)


def test_hf_engine_generation_config_lists_every_end_id(tok):
    eot = tok.convert_tokens_to_ids(END)
    engine = HFEngine(tiny_causal_lm(tok, end_of_turn=END), tok.pad_token_id, tok.eos_token_id)
    assert engine.generation_config(SamplingParams()).eos_token_id == [tok.eos_token_id, eot]
    assert engine.eos_ids == (tok.eos_token_id, eot)


def test_a_saved_models_generation_config_gives_the_engine_its_end_ids(tok, tmp_path):
    """A checkpoint declares its end ids in ``generation_config.json`` (Gemma 2: ``[1, 107]``): the
    engine built from the loaded model and the tokenizer's EOS stops at all of them."""
    from rlhfkit.models.loading import load_causal_lm, load_tokenizer

    tiny_causal_lm(tok, end_of_turn=END).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    engine = HFEngine(load_causal_lm(str(tmp_path)), loaded.pad_token_id, loaded.eos_token_id)
    assert engine.eos_ids == (tok.eos_token_id, tok.convert_tokens_to_ids(END))


def test_vllm_sampling_params_stop_at_every_end_id():
    """vLLM reads no generation config (``generation_config="vllm"``): its stop ids are the whole
    set. (Without vLLM installed: the parameters only, on an engine not started.)"""
    from rlhfkit.rollout.vllm import VLLMEngine

    engine = object.__new__(VLLMEngine)
    engine.eos_ids, engine._sampling_params = (100, 1), dict
    for greedy in (False, True):
        params = engine.sampling_params(SamplingParams(max_new_tokens=4, greedy=greedy), 2, seed=0)
        assert params["stop_token_ids"] == [100, 1] and params["ignore_eos"] is False
