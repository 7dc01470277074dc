"""``rlhfkit serve``'s ``/v1/completions`` with vLLM's ``prompt_logprobs`` (``endpoint/completions.py``): through the
real ``openai`` client and raw HTTP, each position's entry checked against the served model's own log-softmax — the
token that stands there with its log-prob and rank, the top-k in order, None for the first token — token ids sent as
they are, and the refusals naming their field."""

import json
import urllib.error
import urllib.request

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhfkit.serving import build_endpoint
from rlhfkit.tasks.tiny import char_tokenizer, save_tiny_model

from .conftest import serving

pytestmark = pytest.mark.usefixtures("one_thread")
IDS = [5, 17, 3, 9, 9, 30, 2, 11]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("served") / "m", char_tokenizer(), hidden_size=32, layers=2)


@pytest.fixture(scope="module")
def endpoint(model_dir):
    with serving(build_endpoint(model_dir, name="m", device="cpu")) as e:
        yield e


def own_logprobs(model_dir, ids) -> torch.Tensor:
    """(len(ids) - 1, V) the model's log-softmax at the positions predicting ids[1:], from its own logits."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)


def check_entries(entries, ids, want: torch.Tensor, k: int, tokenizer) -> None:
    assert len(entries) == len(ids) and entries[0] is None
    for j in range(1, len(ids)):
        lp, entry = want[j - 1], entries[j]
        token = ids[j]
        top = lp.topk(k)
        keys = {str(token), *map(str, top.indices.tolist())}
        assert set(entry) == keys, (j, entry)
        chosen = entry[str(token)]
        assert chosen["logprob"] == pytest.approx(lp[token].item(), abs=1e-5)
        assert chosen["rank"] == int((lp > lp[token]).sum()) + 1
        assert chosen["decoded_token"] == tokenizer.decode([token])
        for r, (i, v) in enumerate(zip(top.indices.tolist(), top.values.tolist())):
            assert entry[str(i)]["logprob"] == pytest.approx(v, abs=1e-5)
            if i != token:
                assert entry[str(i)]["rank"] == r + 1


def test_the_openai_client_reads_each_prompt_tokens_logprob_and_the_top_k(endpoint, model_dir):
    client = openai.OpenAI(base_url=endpoint.url, api_key="none", max_retries=0, timeout=30)
    r = client.completions.create(model="m", prompt=IDS, max_tokens=1, extra_body={"prompt_logprobs": 3})
    assert r.object == "text_completion" and len(r.choices) == 1 and r.usage.prompt_tokens == len(IDS)
    entries = r.choices[0].model_extra["prompt_logprobs"]
    check_entries(entries, IDS, own_logprobs(model_dir, IDS), 3, endpoint.tokenizer)
    assert len(r.choices[0].model_extra["token_ids"]) == 1


def post(endpoint, body) -> tuple[int, dict]:
    request = urllib.request.Request(
        endpoint.url + "/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_raw_http_scores_several_prompts_with_echo_and_no_completion(endpoint, model_dir):
    """A batch of token-id prompts (as a served teacher is sent), ``echo`` with ``max_tokens`` 0: no completion, the
    prompt's text, and each prompt's entries with the chosen token only (``prompt_logprobs`` 0)."""
    second = [40, 41, 7]
    status, answer = post(endpoint, {"prompt": [IDS, second], "max_tokens": 0, "echo": True, "prompt_logprobs": 0})
    assert status == 200, answer
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    for choice, ids in zip(answer["choices"], [IDS, second]):
        assert choice["text"] == endpoint.tokenizer.decode(ids) and choice["token_ids"] == []
        check_entries(choice["prompt_logprobs"], ids, own_logprobs(model_dir, ids), 0, endpoint.tokenizer)


@pytest.mark.parametrize(
    "body,field",
    [
        ({"prompt": [IDS[:3] + [10**6]], "prompt_logprobs": 1}, "prompt"),
        ({"prompt": IDS, "prompt_logprobs": -2}, "prompt_logprobs"),
        ({"prompt": IDS, "max_tokens": 0}, "max_tokens"),
        ({"prompt": IDS, "stream": True}, "stream"),
        ({"prompt": IDS, "model": "other"}, "model"),
    ],
)
def test_refusals_name_their_field(endpoint, body, field):
    status, answer = post(endpoint, body)
    assert status == (404 if field == "model" else 400), answer
    assert answer["error"]["param"] == field and "\n" not in answer["error"]["message"]
