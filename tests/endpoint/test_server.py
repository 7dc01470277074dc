"""The endpoint as a server (``rlhfkit serve``'s mode) driven by the real ``openai`` client: the
models list, n / seed / stop / max_tokens / temperature 0, tool calls in OpenAI's format parsed by
the agents' parser, a bad request answered in one line (HTTP 400), and no hang (timeouts)."""

import json
import time

import httpx
import openai
import pytest

from rlhfkit.endpoint import Endpoint
from rlhfkit.rollout import HFEngine
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.tasks.tiny import tiny_causal_lm

from .conftest import ScriptedEngine, serving

pytestmark = pytest.mark.usefixtures("one_thread")


def client(endpoint, **kw):
    return openai.OpenAI(base_url=endpoint.url, api_key="none", max_retries=0, **kw)


@pytest.fixture
def tiny(chatml):
    model = tiny_causal_lm(chatml)
    engine = HFEngine(model, chatml.pad_token_id, chatml.eos_token_id)
    return Endpoint(
        engine,
        chatml,
        SamplingParams(max_new_tokens=16),
        "tiny",
        training=False,
        logprob_model=model,
        max_positions=256,
    )


def test_models_n_seed_stop_and_greedy(tiny):
    with serving(tiny) as endpoint:
        c = client(endpoint)
        assert [m.id for m in c.models.list().data] == ["tiny"]
        ask = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6)
        a = c.chat.completions.create(**ask, n=3, seed=11, temperature=1.0, logprobs=True)
        b = c.chat.completions.create(**ask, n=3, seed=11, temperature=1.0)
        assert [x.token_ids for x in a.choices] == [x.token_ids for x in b.choices]  # a seed repeats the sample
        assert len({tuple(x.token_ids) for x in a.choices}) > 1  # n draws, each its own stream
        assert all(len(x.token_ids) <= 6 and len(x.logprobs.content) == len(x.token_ids) for x in a.choices)
        assert a.usage.completion_tokens == sum(len(x.token_ids) for x in a.choices)
        g1, g2 = (c.chat.completions.create(**ask, temperature=0) for _ in range(2))
        assert g1.choices[0].token_ids == g2.choices[0].token_ids  # greedy
        text = a.choices[0].message.content
        stopped = c.chat.completions.create(**ask, n=3, seed=11, temperature=1.0, stop=[text[1]])
        assert stopped.choices[0].message.content == text[: text.index(text[1])]
        assert stopped.choices[0].finish_reason == "stop"


def test_tool_calls_come_back_in_openai_form(chatml):
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><|im_end|>'
    engine = ScriptedEngine(chatml, [[call], ['<tool_call>{"name": add}</tool_call><|im_end|>']])
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    with serving(Endpoint(engine, chatml, SamplingParams(max_new_tokens=200), "m", training=False)) as endpoint:
        c = client(endpoint)
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "1+2"}], tools=tools)
        m = r.choices[0]
        assert m.finish_reason == "tool_calls" and m.message.content is None
        assert m.message.tool_calls[0].function.name == "add"
        assert json.loads(m.message.tool_calls[0].function.arguments) == {"a": 1, "b": 2}
        assert m.message.tool_calls[0].id.startswith("call_")
        bad = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "1+2"}], tools=tools)
        assert bad.choices[0].message.tool_calls is None  # a malformed call is returned as text
        assert bad.choices[0].message.content == '<tool_call>{"name": add}</tool_call>'


@pytest.mark.parametrize(
    "body,says",
    [
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0] must be an object with a role"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature must be in [0, 2]"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens must be in [1,"),
        ({"messages": [{"role": "user", "content": "x"}], "n": "2"}, "n must be an integer"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop must be a string or a list"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True}, "stream=true is not supported"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools must be a list"),
        ({"messages": [{"role": "user", "content": "x" * 300}]}, "no room left to sample"),
    ],
)
def test_a_bad_request_is_one_line_http_400(tiny, body, says):
    with serving(tiny) as endpoint:
        with pytest.raises(openai.BadRequestError) as err:
            client(endpoint).chat.completions.create(model="tiny", **body)
        assert err.value.status_code == 400
        message = err.value.body["message"]
        assert says in message and "\n" not in message
        raw = httpx.post(f"{endpoint.url}/chat/completions", content=b"{not json", timeout=5)
        assert raw.status_code == 400 and raw.json()["error"]["message"] == "the request body is not JSON"
        assert httpx.get(f"{endpoint.url}/nowhere", timeout=5).status_code == 404
        with pytest.raises(openai.BadRequestError, match="unknown episode"):  # a finished step's episode
            openai.OpenAI(base_url=endpoint.episode_url("gone"), api_key="x", max_retries=0).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "x"}]
            )


def test_a_request_nobody_serves_times_out_instead_of_hanging(tiny):
    tiny.request_timeout = 0.5
    tiny.start()  # listening, but no engine loop (as between the trainer's steps)
    try:
        start = time.perf_counter()
        with pytest.raises(openai.APIStatusError) as err:
            client(tiny, timeout=5).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
        assert err.value.status_code == 504 and "no answer within 0.5 s" in err.value.body["message"]
        assert time.perf_counter() - start < 30  # no hang (the 504 itself says the server gave up at 0.5 s)
    finally:
        tiny.stop()


@pytest.mark.slow  # a fresh interpreter loading torch and transformers: ~15 s on 2 busy cores
def test_rlhfkit_serve_answers_the_openai_client(tmp_path, chatml):
    import re
    import signal
    import subprocess
    import sys

    from rlhfkit.tasks.tiny import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny", chatml)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlhfkit", "serve", model_dir, "--port", "0", "--name", "t"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"at (http://\S+/v1)", line).group(1)
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=30)
        r = c.chat.completions.create(model="t", messages=[{"role": "user", "content": "hi"}], max_tokens=4, seed=1)
        assert len(r.choices[0].token_ids) <= 4 and r.model == "t"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0, proc.stderr.read()


@pytest.mark.slow
def test_the_episodes_per_second_benchmark_runs():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "endpoint_episodes.py"
    out = subprocess.run(
        [sys.executable, str(script), "--episodes", "4", "--group-size", "2", "--turns", "2", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "endpoint / in-process time" in out.stdout
