"""Multi-turn and tool-use SFT: every assistant turn (content, tool calls and its <|im_end|>) is
trained and nothing else, tools reach the template, single-turn rows are encoded as before, bad
rows and unusable templates are refused in one line, the chat_template option is applied and
saved, and a tiny model trained on tool conversations calls the tool in its first turn."""

import json
import random

import pytest
import torch
from transformers import AutoTokenizer

from rlhfkit.data.chat_templates import PROBE, PROBE_TOOLS, render, resolve_chat_template
from rlhfkit.data.encode import encode_pair
from rlhfkit.data.sft import IGNORE_INDEX, collate, encode_sft_rows, example_labels, load_sft_dataset
from rlhfkit.data.sft_turns import TurnsEncoded, encode_conversation
from rlhfkit.tasks.tiny import char_tokenizer, chatml_tokenizer, tiny_causal_lm
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "22 C"},
    {"role": "assistant", "content": "It is 22 C."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You are welcome."},
]
TURNS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
    "It is 22 C.<|im_end|>",
    "You are welcome.<|im_end|>",
]


def trained_runs(tok, e) -> list[str]:
    """The labelled tokens of an example, decoded, one string per run of consecutive labels."""
    runs, current = [], []
    for token, label in zip(e.input_ids, example_labels(e)):
        if label != IGNORE_INDEX:
            assert label == token
            current.append(token)
        elif current:
            runs, current = runs + [tok.decode(current)], []
    return runs + ([tok.decode(current)] if current else [])


# ---------------------------------------------------------------- labels


def test_every_assistant_turn_is_trained_and_nothing_else():
    tok = chatml_tokenizer()
    [e] = encode_sft_rows([{"messages": CONVERSATION}], tok, None)
    assert isinstance(e, TurnsEncoded)
    assert trained_runs(tok, e) == TURNS
    text = tok.decode(e.input_ids)
    assert text == render(tok, CONVERSATION).removesuffix("\n")  # the glue after the last <|im_end|> is dropped
    untrained = tok.decode([t for t, m in zip(e.input_ids, e.mask) if not m])
    for masked in [
        "<|im_start|>user\nWeather in Paris?<|im_end|>",
        "<|im_start|>tool\n<tool_response>\n22 C",
        "<|im_start|>assistant\n",
        "Thanks!",
    ]:
        assert masked in untrained
    assert e.prompt_len == len(tok(render(tok, CONVERSATION[:1], generation=True))["input_ids"])


def test_the_tools_column_reaches_the_template():
    tok = chatml_tokenizer()
    rows = [{"messages": PROBE, "tools": PROBE_TOOLS}, {"messages": PROBE}]
    with_tools, without = encode_sft_rows(load_sft_dataset(rows), tok, None)
    schema = json.dumps(PROBE_TOOLS[0])
    assert schema in tok.decode(with_tools.input_ids) and schema not in tok.decode(without.input_ids)
    assert (
        trained_runs(tok, with_tools)
        == trained_runs(tok, without)
        == [
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
            "It is 22 degrees and sunny in Paris.<|im_end|>",
        ]
    )


def test_a_conversation_may_end_with_a_tool_call_and_take_a_none_content():
    tok = chatml_tokenizer()
    row = {"messages": [CONVERSATION[0], {"role": "assistant", "content": None, "tool_calls": [CALL]}]}
    [e] = encode_sft_rows(load_sft_dataset([row]), tok, None)
    assert trained_runs(tok, e) == TURNS[:1]


def test_a_template_without_eos_text_trains_whole_turns_and_the_appended_eos():
    tok = char_tokenizer()  # its template ends a turn with "\n" and never writes the EOS
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "ya"},
    ]
    [e] = encode_sft_rows([{"messages": messages}], tok, None)
    assert tok.decode(e.input_ids) == "u:hi\na:yo\nu:ok\na:ya\n<eos>"
    assert trained_runs(tok, e) == ["yo\n", "ya\n<eos>"]


def test_single_turn_rows_keep_encode_pair_and_the_turns_path_gives_the_same_tokens():
    tok = chatml_tokenizer()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    [old] = encode_sft_rows([{"messages": messages}], tok, None)
    assert old == encode_pair(messages[:2], "Hello!", tok)  # the row takes encode_pair, as before
    new = encode_conversation(messages, tok)
    assert new.input_ids == old.input_ids and example_labels(new) == example_labels(old)
    assert new.prompt_len == old.prompt_len


def test_truncation_cuts_the_start_before_the_first_turn_then_the_end():
    tok = chatml_tokenizer()
    full = encode_conversation(CONVERSATION, tok)
    n, first = len(full.input_ids), full.prompt_len
    cut = encode_conversation(CONVERSATION, tok, max_length=n - 5)
    assert cut.input_ids == full.input_ids[5:] and cut.mask == full.mask[5:] and cut.cut and not cut.truncated
    short = encode_conversation(CONVERSATION, tok, max_length=4)  # one token before the first turn, 3 of it
    assert short.input_ids == full.input_ids[first - 1 : first + 3] and short.truncated and short.prompt_len == 1
    assert short.mask == (0, 1, 1, 1)
    [row] = encode_sft_rows([{"messages": CONVERSATION}], tok, 4)
    assert row == short


def test_packed_multi_turn_examples_keep_their_labels():
    tok = chatml_tokenizer()
    a, b = encode_sft_rows([{"messages": CONVERSATION}, {"messages": PROBE}], tok, None)
    batch = collate([a, b], tok.pad_token_id, packing=True, max_length=len(a.input_ids) + len(b.input_ids))
    by_mask = [[IGNORE_INDEX] + [t if m else IGNORE_INDEX for t, m in zip(e.input_ids[1:], e.mask[1:])] for e in (a, b)]
    assert batch["labels"][0].tolist() == by_mask[0] + by_mask[1]
    assert sum(a.mask) == len(tok("".join(TURNS))["input_ids"])


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "row,field,expected",
    [
        (
            {"messages": [CONVERSATION[0], {"role": "tool"}, CONVERSATION[3]]},
            "messages",
            r"message 1 \(0-based\): a tool message needs 'content'",
        ),
        (
            {"messages": [CONVERSATION[0], {"role": "assistant", "content": "", "tool_calls": CALL}]},
            "messages",
            r"message 1 \(0-based\): 'tool_calls' must be a non-empty list",
        ),
        (
            {
                "messages": [
                    CONVERSATION[0],
                    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]},
                ]
            },
            "messages",
            r"tool call 0 \(0-based\): 'arguments' must be an object",
        ),
        (
            {"messages": [CONVERSATION[0], {"role": "assistant", "tool_calls": [{"function": {"arguments": "{"}}]}]},
            "messages",
            r"tool call 0 .*needs a 'name'",
        ),
        (
            {"messages": [{"role": "robot", "content": "x"}, *CONVERSATION[1:]]},
            "messages",
            r"message 0 \(0-based\): 'role' must be one of system, user, assistant, tool, got 'robot'",
        ),
        ({"messages": CONVERSATION[1:]}, "messages", r"message 0 \(0-based\) is the assistant's"),
        ({"messages": CONVERSATION, "tools": {"name": "f"}}, "tools", r"expected a list of tool JSON schemas"),
        ({"prompt": "a", "completion": "b", "tools": PROBE_TOOLS}, "tools", r"tools go with 'messages' rows"),
    ],
)
def test_bad_rows_name_the_row_and_field(row, field, expected):
    with pytest.raises(ValueError, match=expected) as err:
        load_sft_dataset([{"messages": CONVERSATION}, row], name="my_data")
    assert str(err.value).startswith(f"my_data: row index 1 (0-based): field {field!r}: ")
    assert "\n" not in str(err.value)


def test_templates_multi_turn_rows_cannot_use_are_refused_in_one_line(forgetful_template):
    tok = chatml_tokenizer()
    tok.chat_template = forgetful_template
    tok.name_or_path = "org/thinking-model"
    # a template that rewrites history is used turn by turn (tests/data/test_sft_rewritten_history.py)
    assert len(encode_sft_rows([{"messages": CONVERSATION}], tok, None)) == 3
    plain = [
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
                {"role": "assistant", "content": "d"},
            ]
        },
    ]
    assert len(encode_sft_rows(plain, tok, None, name="eval")) == 3
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}{% if loop.last %}!{% endif %}]{{ m['content'] }}"
        "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    )  # the last turn's own header
    with pytest.raises(
        ValueError,
        match=r"^eval: row index 0 \(0-based\): org/thinking-model: the chat template does "
        r"not render assistant message 1 \(0-based\) after [^\n]*$",
    ):
        encode_sft_rows(plain[1:], tok, None, name="eval")
    tok.chat_template = None
    with pytest.raises(ValueError, match=r"org/thinking-model: multi-turn 'messages' rows need a chat template"):
        encode_sft_rows(plain, tok, None)


# ---------------------------------------------------------------- the trainer


def test_the_chat_template_option_is_applied_and_saved_with_the_model(tmp_path):
    tok = chatml_tokenizer()
    tok.chat_template = None
    out = tmp_path / "run"
    config = SFTConfig(chat_template="chatml_tools", max_steps=1, batch_size=2, log_every=0, output_dir=str(out))
    SFTTrainer(
        tiny_causal_lm(tok, hidden_size=32), config, [{"messages": CONVERSATION}] * 2, processing_class=tok
    ).train()
    assert AutoTokenizer.from_pretrained(out / "final").chat_template == resolve_chat_template("chatml_tools")
    with pytest.raises(ValueError, match=r"^chat_template: 'chatml' is neither a shipped template"):
        SFTTrainer(str(tmp_path / "no-such-model"), SFTConfig(chat_template="chatml"), [{"messages": CONVERSATION}])


def _weather(rng, city: str) -> list[dict]:
    temp = rng.randint(0, 30)
    return [
        {"role": "user", "content": rng.choice(["weather in {}?", "how warm is {}?"]).format(city)},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}],
        },
        {"role": "tool", "content": f"{temp} c"},
        {"role": "assistant", "content": f"it is {temp} c in {city}."},
    ]


@pytest.mark.slow  # moved out of the default suite for its 5-minute budget (issue 31); CI runs it in make test-slow
def test_after_sft_on_tool_conversations_the_first_turn_calls_the_tool():
    """40 two-turn conversations (tool call, then the answer), 100 steps of a tiny Llama; greedy
    first turns of 12 held-out prompts (unseen cities) are well-formed get_weather calls (11 of 12
    measured; copying the city is beyond this model and budget). Training only the last assistant
    turn, as SFT did before, never teaches the call."""
    rng = random.Random(0)
    names = (
        "".join(rng.choice("bcdfgklmnprstv") + rng.choice("aeiou") for _ in range(rng.randint(2, 3))) for _ in range(80)
    )
    conversations = [_weather(rng, city) for city in list(dict.fromkeys(names))[:52]]
    tok = chatml_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=128)
    config = SFTConfig(learning_rate=3e-3, batch_size=8, max_steps=100, log_every=0, lr_scheduler="constant")
    SFTTrainer(model, config, [{"messages": m} for m in conversations[:40]], processing_class=tok).train()
    prompts = [render(tok, m[:1], generation=True) for m in conversations[40:]]
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    model.eval()
    with torch.no_grad():
        out = model.generate(
            **batch, max_new_tokens=90, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
        )
    calls = 0
    for row in out[:, batch["input_ids"].shape[1] :]:
        text = tok.decode(row, skip_special_tokens=True)
        if text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>"):
            try:
                call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
            except json.JSONDecodeError:
                continue
            calls += call.get("name") == "get_weather" and isinstance(call.get("arguments", {}).get("city"), str)
    assert calls >= 9, calls
