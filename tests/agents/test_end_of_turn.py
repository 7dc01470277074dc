"""Agent episodes of a model whose turns end with a token other than its tokenizer's EOS (Gemma 2's
``<end_of_turn>`` beside ``<eos>``): a turn ends at the model's end of turn (the engine's whole EOS
set, ``models.loading.eos_token_ids``), its tool calls are read, the tool suffix is the
template's text after that token, and the episode is not truncated; the endpoint agent programs
talk to answers such a turn as stopped, not cut at ``max_tokens``."""

import json
import threading
from types import SimpleNamespace

import pytest

from rlhfkit import RLConfig, RLTrainer
from rlhfkit.agents import AgentOptions, make_tools, run_episodes, start_episode
from rlhfkit.agents.agent import Agent
from rlhfkit.models.loading import eos_token_ids
from rlhfkit.rollout import HFEngine, build_rollout
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.tasks.calculator_demo import TINY_TOOLS_TEMPLATE
from rlhfkit.tasks.tiny import chatml_tokenizer, tiny_causal_lm, tiny_turn_end_lm

from .conftest import add

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

END = "<|im_end|>"
CALL = '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 7}}</tool_call>' + END
USER = [{"role": "user", "content": "12+7?"}]
SUFFIX = "<|im_start|>tool\n19<|im_end|><|im_start|>assistant\n"  # TINY_TOOLS_TEMPLATE's, after <|im_end|>


@pytest.fixture
def tok():
    """Turns end with <|im_end|>; the tokenizer's EOS is a separate <eos> the template never writes."""
    tok = chatml_tokenizer(eos_token="<eos>")
    tok.chat_template = TINY_TOOLS_TEMPLATE
    return tok


class TurnEndEngine:
    """Replays scripted turns, ending each at the first of ``eos_ids`` (as an engine of a model
    with those end ids does), and records the contexts it was given."""

    needs_sync = False

    def __init__(self, tokenizer, turns, eos_ids):
        self.tokenizer, self.turns, self.eos_ids, self.contexts = tokenizer, turns, eos_ids, []

    def generate(self, prompts, n, sampling, seed=None):
        texts = self.turns[len(self.contexts)]
        self.contexts.append([list(p) for p in prompts])
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"][: sampling.max_new_tokens] for t in texts]
        return build_rollout(prompts, ids, 1, self.tokenizer.pad_token_id, self.eos_ids)

    def sleep(self):
        pass


def test_hf_episode_turn_ends_at_the_models_end_of_turn(tok):
    """The real HF engine, given the tokenizer's EOS only: each turn stops at <|im_end|> (the
    model's generation config lists it), makes no tool call, and ends its episode un-truncated."""
    eot = tok.convert_tokens_to_ids(END)
    model = tiny_turn_end_lm(tok, seed=0).eval()
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id)
    episodes = [start_episode(tok, USER, make_tools([add])) for _ in range(4)]
    rollout = run_episodes(engine, tok, episodes, SamplingParams(max_new_tokens=60), AgentOptions(), seed=1)
    for e in episodes:
        assert e.ids[-1] == eot and eot not in e.ids[:-1], tok.decode(e.ids)
        assert e.has_eos and not e.truncated and e.turns == 1
        assert END not in e.messages[-1]["content"]
    assert rollout.has_eos.all()
    assert rollout.response_mask.sum(-1).tolist() == [len(e.ids) for e in episodes]  # the end of turn is trained


def test_a_tool_turn_ended_by_the_end_of_turn_is_answered_and_continued(tok):
    model = tiny_causal_lm(tok, end_of_turn=END)
    ends = eos_token_ids(tok, model)
    agent = Agent(tok, tools=[add], eos_ids=ends)  # the template check finds the turn's end: <|im_end|>
    (e,) = agent.start([{"prompt": USER}], [0], 1)
    engine = TurnEndEngine(tok, [[CALL], ["19" + END]], ends)
    rollout, _ = agent.run(engine, [e], SamplingParams(max_new_tokens=200))
    assert [m["role"] for m in e.messages] == ["assistant", "tool", "assistant"]
    assert e.messages[0]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 12, "b": 7}}
    assert e.messages[-1]["content"] == "19" and e.has_eos and not e.truncated and e.turns == 2
    first = tok(CALL, add_special_tokens=False)["input_ids"]
    suffix = tok(SUFFIX, add_special_tokens=False)["input_ids"]
    assert engine.contexts[1][0] == e.prompt_ids + first + suffix  # the suffix follows the end of turn
    assert bool(rollout.has_eos[0])


def last_content(prompts, completions, **columns):
    return [float(c[-1]["content"] == "19") for c in completions]


def test_the_trainer_takes_the_end_of_turn_from_the_model(tok):
    """``RLTrainer(tools=...)`` with such a model: its template check and episodes use the model's
    end ids (a template that never writes the tokenizer's EOS is not refused), and a tool episode
    ended by <|im_end|> is scored, not penalised as missing its EOS."""
    model = tiny_turn_end_lm(tok, seed=0)
    args = RLConfig(
        algorithm="grpo",
        prompts_per_step=1,
        group_size=2,
        max_steps=1,
        save_steps=0,
        kl_coef=0.0,
        log_every=0,
        max_new_tokens=120,
        missing_eos_penalty=-3.0,
        normalize_rewards=False,
    )
    t = RLTrainer(model, [last_content], args, [{"prompt": USER}], processing_class=tok, tools=[add])
    t.sampler.engine = TurnEndEngine(tok, [[CALL, "no call" + END], ["19" + END]], eos_token_ids(tok, model))
    rows = t.sampler.sample_prompts()
    rollout, episodes = t.sampler.generate(rows)
    scores, valid, metrics = t.sampler.score(rows, rollout, episodes)
    assert [e.turns for e in episodes] == [2, 1] and not any(e.truncated for e in episodes)
    assert rollout.has_eos.tolist() == [True, True]
    assert scores.tolist() == [1.0, 0.0]  # no -3.0: both ended
    assert json.loads(json.dumps(episodes[0].messages[1]))["content"] == "19"


def test_the_endpoint_answers_a_turn_ended_by_the_end_of_turn_as_stopped(tok):
    """``endpoint.sampling.answer_group`` (a batch of requests, past the server's checks): each
    reply ends at <|im_end|>, not shown in its text, finished as "stop", not "length"."""
    from rlhfkit.endpoint.sampling import answer_group
    from rlhfkit.endpoint.server import Serving

    eot = tok.convert_tokens_to_ids(END)
    model = tiny_turn_end_lm(tok, seed=0).eval()
    endpoint = SimpleNamespace(tokenizer=tok, logprob_model=None, model_name="tiny", training=False)
    serving = Serving(HFEngine(model, tok.pad_token_id, tok.eos_token_id), SamplingParams(max_new_tokens=40))
    request = SimpleNamespace(n=4, stop=[], tools=None, tool_choice="auto", logprobs=False)
    prompt = tok.apply_chat_template(USER, add_generation_prompt=True, tokenize=True, return_dict=False)
    pending = SimpleNamespace(
        request=request,
        sampling=SamplingParams(max_new_tokens=40),
        seed=5,
        prompt_ids=prompt,
        turn=0,
        record=None,
        messages=USER,
    )
    (answer,) = answer_group(endpoint, [pending], serving)
    for choice in answer["choices"]:
        assert choice["token_ids"][-1] == eot and eot not in choice["token_ids"][:-1], choice["token_ids"]
        assert choice["finish_reason"] == "stop" and END not in choice["message"]["content"]


def test_the_endpoint_server_serves_such_a_model(tok):
    import openai

    from rlhfkit.endpoint import Endpoint

    model = tiny_turn_end_lm(tok, seed=0).eval()
    endpoint = Endpoint(
        HFEngine(model, tok.pad_token_id, tok.eos_token_id),
        tok,
        SamplingParams(max_new_tokens=40),
        "tiny",
        training=False,
        max_positions=256,
    ).start()
    done = threading.Event()
    thread = threading.Thread(target=endpoint.serve, kwargs={"until": done.is_set}, daemon=True)
    thread.start()
    try:
        c = openai.OpenAI(base_url=endpoint.url, api_key="none", max_retries=0)
        r = c.chat.completions.create(model="tiny", messages=USER, max_tokens=40, seed=5, temperature=1.0)
    finally:
        done.set()
        thread.join(timeout=10)
        endpoint.stop()
    assert r.choices[0].finish_reason == "stop"
