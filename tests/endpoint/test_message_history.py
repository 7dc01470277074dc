"""A chat request's message history with malformed tool calls is refused in one line (HTTP 400,
naming the message index and the field), through the real server and the openai client — never a
500 with a traceback; a well-formed history (arguments as OpenAI's JSON string, or an object) is
answered."""

import openai
import pytest

from rlhfkit.endpoint import Endpoint
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.tasks.tiny import chatml_tokenizer

from .conftest import ScriptedEngine, serving

pytestmark = pytest.mark.usefixtures("one_thread")

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
GOOD_CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}


def history(calls, tool_message=None):
    """user, assistant with ``calls`` as its tool_calls, the tool's answer, user."""
    tool = tool_message or {"role": "tool", "tool_call_id": "call_1", "content": "3"}
    return [
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        tool,
        {"role": "user", "content": "and now?"},
    ]


def with_function(**function):
    return [{"id": "call_1", "type": "function", "function": function}]


@pytest.fixture(scope="module")
def endpoint():
    tok = chatml_tokenizer()
    engine = ScriptedEngine(tok, [["3<|im_end|>"]] * 20)  # a reply per answered request
    with serving(Endpoint(engine, tok, SamplingParams(max_new_tokens=4), "tiny", training=False)) as e:
        yield e


def ask(endpoint, messages):
    c = openai.OpenAI(base_url=endpoint.url, api_key="none", max_retries=0, timeout=30)
    return c.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=2)


@pytest.mark.parametrize(
    "messages,says",
    [
        (history({"0": GOOD_CALL}), "messages[1].tool_calls: expected a list of tool calls, got an object"),
        (history("add(1, 2)"), "messages[1].tool_calls: expected a list of tool calls, got a string"),
        (
            history(["add(1, 2)"]),
            "messages[1].tool_calls[0]: expected an object with 'id', 'type' and 'function', got a string",
        ),
        (
            history([GOOD_CALL, {"id": "call_2", "type": "function", "function": "add"}]),
            "messages[1].tool_calls[1].function: expected an object with 'name' and 'arguments', got a string",
        ),
        (
            history([{"id": "call_1", "type": "function"}]),
            "messages[1].tool_calls[0].function: expected an object with 'name' and 'arguments', got nothing",
        ),
        (
            history(with_function(arguments="{}")),
            "messages[1].tool_calls[0].function.name: expected a string, got nothing",
        ),
        (
            history(with_function(name=["add"], arguments="{}")),
            "messages[1].tool_calls[0].function.name: expected a string, got a list",
        ),
        (
            history(with_function(name="add", arguments=12)),
            "messages[1].tool_calls[0].function.arguments: expected a JSON string (or an object), got a number",
        ),
        (
            history(with_function(name="add", arguments=[1, 2])),
            "messages[1].tool_calls[0].function.arguments: expected a JSON string (or an object), got a list",
        ),
        (history([{**GOOD_CALL, "id": ["call_1"]}]), "messages[1].tool_calls[0].id: expected a string, got a list"),
        (
            history([GOOD_CALL], {"role": "tool", "tool_call_id": {"id": "call_1"}, "content": "3"}),
            "messages[2].tool_call_id: expected a string, got an object",
        ),
        (
            history(with_function(name="", arguments="{}")),
            "messages[1].tool_calls[0].function.name: expected a string, got an empty string",
        ),
        (
            history([GOOD_CALL], {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": 3}]}),
            "messages[2].content[0].text: expected a string, got a number",
        ),
        (
            [{"role": "user", "content": ["1+2?"]}],
            "messages[0].content[0]: expected an object (a content part), got a string",
        ),
    ],
)
def test_malformed_tool_calls_in_the_history_are_one_line_http_400(endpoint, messages, says):
    with pytest.raises(openai.BadRequestError) as err:
        ask(endpoint, messages)
    assert err.value.status_code == 400
    message = err.value.body["message"]
    assert message == says and "\n" not in message
    assert err.value.body["type"] == "invalid_request_error" and err.value.body["param"] == "messages"


@pytest.mark.parametrize("arguments", ['{"a": 1, "b": 2}', {"a": 1, "b": 2}, "", None])
def test_a_well_formed_tool_call_history_is_answered(endpoint, arguments):
    """OpenAI's form (arguments a JSON string), and the lenient ones taken: an object, empty, absent."""
    function = {"name": "add"} if arguments is None else {"name": "add", "arguments": arguments}
    answer = ask(endpoint, history([{"id": "call_1", "type": "function", "function": function}]))
    assert answer.choices[0].message.content == "3" and answer.choices[0].finish_reason == "stop"
