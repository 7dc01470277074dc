"""``rlhfkit serve`` serves the models people have, through the real server and the openai client:
the quickstart's (a character tokenizer whose template ``r:content`` never writes its ``<eos>``),
one with a plain ``role: content`` template, and a model given ``--chat-template``. The agent
template check (the template ends an assistant turn with an EOS token) applies only where a
sampled turn is continued token for token: a later request of a training episode."""

import openai
import pytest

from rlhfkit.endpoint import Endpoint
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.serving import build_endpoint
from rlhfkit.tasks import shift
from rlhfkit.tasks.tiny import char_tokenizer, chatml_tokenizer, save_tiny_model

from .conftest import ScriptedEngine, serving

pytestmark = pytest.mark.usefixtures("one_thread")
ROLE_CONTENT = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
USER = [{"role": "user", "content": "abc"}]


def client(endpoint):
    return openai.OpenAI(base_url=endpoint.url, api_key="none", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def quickstart_dir(tmp_path_factory):
    """A model directory as the quickstart saves its policies: ``char_tokenizer`` over the shift
    task's letters (EOS ``<eos>``, the ``r:content`` template), a 64-wide 2-layer Llama."""
    tok = char_tokenizer(alphabet=shift.LETTERS + "=")
    return save_tiny_model(tmp_path_factory.mktemp("quickstart") / "final", tok, hidden_size=64, layers=2)


def test_the_quickstart_model_is_served(quickstart_dir):
    with serving(build_endpoint(quickstart_dir, name="qs", device="cpu")) as endpoint:
        r = client(endpoint).chat.completions.create(model="qs", messages=USER, max_tokens=4, seed=1)
    assert r.model == "qs" and 1 <= len(r.choices[0].token_ids) <= 4
    assert r.usage.prompt_tokens == len("u:abc\na:")  # rendered with the model's own template


def test_a_model_with_a_role_content_template_is_served(tmp_path):
    tok = chatml_tokenizer()
    tok.chat_template = ROLE_CONTENT
    model_dir = save_tiny_model(tmp_path / "m", tok)
    with serving(build_endpoint(model_dir, name="m", device="cpu")) as endpoint:
        r = client(endpoint).chat.completions.create(model="m", messages=USER, max_tokens=3, seed=2, n=2)
    assert len(r.choices) == 2 and r.usage.prompt_tokens == len("user: abc\nassistant: ")


CHATML_PROMPT = "<|im_start|>user\nabc<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("template,prompt", [(ROLE_CONTENT, "user: abc\nassistant: "), ("chatml_tools", CHATML_PROMPT)])
def test_chat_template_takes_effect(quickstart_dir, template, prompt):
    """``--chat-template`` (here: inline Jinja, and the shipped ``chatml_tools`` the old refusal
    advised) renders the requests — neither is refused, though neither ends a turn with ``<eos>``."""
    with serving(build_endpoint(quickstart_dir, name="qs", chat_template=template, device="cpu")) as endpoint:
        r = client(endpoint).chat.completions.create(model="qs", messages=USER, max_tokens=2, seed=3)
    tok = endpoint.tokenizer
    assert r.usage.prompt_tokens == len(tok(prompt, add_special_tokens=False)["input_ids"])


def test_a_training_episode_is_checked_only_where_it_continues_a_sampled_turn():
    """A training episode's first request renders the messages (no check), as does one that edits
    the history; a request that extends the turn the endpoint sampled is refused in one line when
    the template does not end that turn with an EOS token (it could not be continued token for token)."""
    tok = chatml_tokenizer()
    tok.chat_template = ROLE_CONTENT
    engine = ScriptedEngine(tok, [["hi<|im_end|>"]] * 3)
    endpoint = Endpoint(engine, tok, SamplingParams(max_new_tokens=8), "policy", training=True)
    with serving(endpoint):
        record = endpoint.new_episode(budget=64)
        c = openai.OpenAI(base_url=endpoint.episode_url(record.id), api_key="x", max_retries=0, timeout=30)
        first = c.chat.completions.create(model="policy", messages=USER)
        assert first.choices[0].message.content == "hi" and len(record.calls) == 1
        history = USER + [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model="policy", messages=history)
        edited = USER + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
        assert c.chat.completions.create(model="policy", messages=edited).choices[0].message.content == "hi"
    assert len(record.calls) == 2  # the edited history was rendered and recorded, as a new segment
    message = err.value.body["message"]
    assert "does not end an assistant turn with an EOS token" in message and "\n" not in message


@pytest.mark.slow  # a fresh interpreter loading torch and transformers: ~15 s on 2 busy cores
def test_rlhfkit_serve_with_chat_template_answers(quickstart_dir):
    """The command as the issue ran it: ``rlhfkit serve DIR --chat-template chatml_tools``."""
    import re
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "rlhfkit", "serve", quickstart_dir, "--port", "0", "--chat-template", "chatml_tools"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = re.search(r"at (http://\S+/v1)", proc.stdout.readline()).group(1)
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=30)
        r = c.chat.completions.create(model="final", messages=USER, max_tokens=3, seed=1)
        assert len(r.choices[0].token_ids) <= 3 and r.model == "final"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0, proc.stderr.read()
