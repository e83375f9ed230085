"""The ``api`` comparator against a local HTTP server: each format's request and answers,
requests repeated until every candidate is there, the key (from the environment only, sent
as each format wants it, never saved), the errors that name the culprit, the answers as the
agents' tokens, and MADPOIter and MARLHFIter runs whose output folders never hold the key."""

import json
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from comlrl.trainers.dpo import MADPOIterConfig, MADPOIterTrainer
from comlrl.trainers.dpo.api_comparator import ApiClient, ComparatorApiError
from comlrl.trainers.rlhf import MARLHFIterConfig, MARLHFIterTrainer

from .helpers import DATA, char_tokenizer, content_score, tiny_llama

KEY = "sk-test-Secret0123456789abcdef"
"""The key the tests export; it must reach the server and nothing else."""
KEY_ENV = "COMLRL_TEST_COMPARATOR_KEY"
SAMPLING = {"do_sample": True, "max_new_tokens": 7, "temperature": 0.6, "top_p": 0.9, "top_k": 50}
"""Hugging Face generate arguments, as the trainer passes them to a backend."""


# ------------------------------------------------------------------------------ the server
class Endpoint:
    """A local endpoint: records every request (path, lower-cased headers, JSON body) and
    answers with ``reply(body) -> (status, JSON value or raw bytes)``."""

    def __init__(self):
        self.requests = []
        self.reply = lambda body: (200, {"completions": ["ok"] * body.get("num_return_sequences", 1)})
        self.url = ""

    @property
    def bodies(self):
        return [body for _, _, body in self.requests]


@pytest.fixture
def endpoint():
    served = Endpoint()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            served.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            status, answer = served.reply(body)
            data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    served.url = f"http://127.0.0.1:{server.server_port}/v1/generate"
    yield served
    server.shutdown()
    server.server_close()


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def api_config(endpoint, **overrides):
    values = dict(comparator_policy="api", comparator_api_url=endpoint.url)
    values.update(overrides)
    return MADPOIterConfig(**values)


def client(endpoint, **overrides):
    return ApiClient.from_config(api_config(endpoint, **overrides))


def chat_answer(body):
    return 200, {"choices": [{"message": {"content": f"chat {i}"}} for i in range(body["n"])]}


# ------------------------------------------------------------------------------ each format's request
def test_generic_request_and_answers_by_hand(endpoint):
    ask = client(endpoint, comparator_api_model="m1", comparator_api_extra_body={"stop": ["\n"], "temperature": 0.1})
    endpoint.reply = lambda body: (200, {"completions": ["one", {"text": "two"}, {"message": {"content": "three"}}]})
    assert ask.completions("say hi", 1, 0, 3, SAMPLING) == ["one", "two", "three"]
    assert endpoint.bodies == [
        {
            "prompt": "say hi",
            "agent_idx": 1,
            "num_return_sequences": 3,
            "max_new_tokens": 7,
            "temperature": 0.1,  # extra_body is merged over the fields
            "top_p": 0.9,
            "top_k": 50,
            "model": "m1",
            "stop": ["\n"],
        }
    ]
    path, headers, _ = endpoint.requests[0]
    assert path == "/v1/generate" and headers["content-type"] == "application/json"
    assert "authorization" not in headers  # no comparator_api_key_env: no key is sent


def test_generic_reads_a_dotted_path_then_1_4_3s_fallbacks(endpoint):
    endpoint.reply = lambda body: (200, {"data": {"texts": ["a", "b"]}, "outputs": ["x", "y"]})
    assert client(endpoint, comparator_api_response_field="data.texts").completions("p", 0, 0, 2, SAMPLING) == [
        "a",
        "b",
    ]
    assert client(endpoint, comparator_api_response_field="data.none").completions("p", 0, 0, 2, SAMPLING) == [
        "x",
        "y",
    ]


def test_openai_chat_splits_n_by_max_n_per_request(endpoint):
    endpoint.reply = chat_answer
    ask = client(
        endpoint, comparator_api_format="openai", comparator_api_model="gpt", comparator_api_max_n_per_request=2
    )
    assert ask.api_format == "openai_chat"
    assert ask.completions("hi", 0, 0, 5, SAMPLING) == ["chat 0", "chat 1", "chat 0", "chat 1", "chat 0"]
    assert [body["n"] for body in endpoint.bodies] == [2, 2, 1]
    assert endpoint.bodies[0] == {
        "model": "gpt",
        "messages": [{"role": "user", "content": "hi"}],
        "n": 2,
        "max_tokens": 7,
        "temperature": 0.6,
        "top_p": 0.9,
    }


def test_an_endpoint_that_answers_fewer_than_asked_is_asked_again(endpoint):
    endpoint.reply = lambda body: (200, {"choices": [{"text": "one"}]})  # as DeepSeek, which ignores n
    assert client(endpoint, comparator_api_format="chat").completions("hi", 0, 0, 3, SAMPLING) == ["one"] * 3
    assert [body["n"] for body in endpoint.bodies] == [3, 2, 1]


def test_anthropic_messages_one_answer_per_request_with_x_api_key(endpoint, key):
    blocks = [{"type": "text", "text": "hello "}, {"type": "tool_use"}, {"type": "text", "text": "there"}]
    endpoint.reply = lambda body: (200, {"content": blocks})
    ask = client(
        endpoint, comparator_api_format="Anthropic", comparator_api_model="claude", comparator_api_key_env=KEY_ENV
    )
    assert ask.completions("hi", 0, 0, 3, SAMPLING) == ["hello there"] * 3  # one answer's text blocks, joined
    assert (
        endpoint.bodies
        == [{"model": "claude", "max_tokens": 7, "messages": [{"role": "user", "content": "hi"}], "temperature": 0.6}]
        * 3
    )
    headers = endpoint.requests[0][1]
    assert headers["x-api-key"] == key and "authorization" not in headers  # 1.4.3's rule: no Bearer
    assert headers["anthropic-version"] == "2023-06-01"


def test_openai_responses_one_answer_per_request(endpoint):
    output = [{"type": "reasoning"}, {"type": "message", "content": [{"type": "output_text", "text": "done"}]}]
    endpoint.reply = lambda body: (200, {"output": output})
    ask = client(endpoint, comparator_api_format="codex", comparator_api_model="gpt-5")
    assert ask.completions("hi", 0, 0, 2, SAMPLING) == ["done", "done"]
    assert endpoint.bodies == [{"model": "gpt-5", "input": "hi", "max_output_tokens": 7}] * 2


@pytest.mark.parametrize(
    "spelling, canonical",
    [
        ("generic", "generic"),
        ("OpenAI", "openai_chat"),
        ("chat", "openai_chat"),
        ("anthropic", "anthropic_messages"),
        ("messages", "anthropic_messages"),
        ("responses", "openai_responses"),
        ("codex", "openai_responses"),
    ],
)
def test_1_4_3s_format_spellings(endpoint, spelling, canonical):
    assert api_config(endpoint, comparator_api_format=spelling).comparator_api_format == canonical


# ------------------------------------------------------------------------------ the key
def test_the_key_comes_from_the_environment_in_the_configured_header(endpoint, key):
    client(endpoint, comparator_api_key_env=KEY_ENV).completions("p", 0, 0, 1, SAMPLING)
    assert endpoint.requests[-1][1]["authorization"] == f"Bearer {key}"
    custom = client(
        endpoint,
        comparator_api_key_env=KEY_ENV,
        comparator_api_key_header="api-key",
        comparator_api_key_prefix="",
        comparator_api_headers={"OpenAI-Organization": "org-1"},
    )
    custom.completions("p", 0, 0, 1, SAMPLING)
    headers = endpoint.requests[-1][1]
    assert headers["api-key"] == key and "authorization" not in headers and headers["openai-organization"] == "org-1"


def test_a_literal_key_is_refused_without_quoting_it(endpoint):
    with pytest.raises(ValueError, match=r"comparator_api_key would be saved .* set comparator_api_key_env") as error:
        api_config(endpoint, comparator_api_key=KEY)
    assert KEY not in str(error.value)
    with pytest.raises(ValueError, match=r"comparator_api_key would be saved"):
        MADPOIterConfig(comparator_api_key=KEY)  # with any comparator


@pytest.mark.parametrize("header", ["Authorization", "X-Api-Key", "api-key", "X-Auth-Token", "My-Secret"])
def test_credential_headers_are_refused_without_quoting_them(endpoint, header):
    with pytest.raises(ValueError, match=rf"comparator_api_headers names credential headers \['{header}'\]") as error:
        api_config(endpoint, comparator_api_headers={header: KEY, "Accept": "application/json"})
    assert KEY not in str(error.value)


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"comparator_api_extra_body": {"api_key": KEY}}, r"comparator_api_extra_body names credential fields"),
        ({"comparator_api_url": f"https://user:{KEY}@example.com/v1"}, r"comparator_api_url carries a user name"),
        ({"comparator_api_url": f"https://example.com/v1?key={KEY}"}, r"comparator_api_url carries the query param"),
        ({"comparator_api_key_env": KEY}, r"comparator_api_key_env must be the NAME of an environment variable"),
    ],
)
def test_keys_elsewhere_in_the_config_are_refused_without_quoting_them(endpoint, overrides, match):
    with pytest.raises(ValueError, match=match) as error:
        api_config(endpoint, **overrides)
    assert KEY not in str(error.value)


def test_an_unset_key_variable_is_named(tmp_path, endpoint, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=rf"comparator_api_key_env='{KEY_ENV}': the environment variable {KEY_ENV} is"):
        client(endpoint, comparator_api_key_env=KEY_ENV).completions("p", 0, 0, 1, SAMPLING)
    monkeypatch.setenv(KEY_ENV, "")
    with pytest.raises(ValueError, match=rf"{KEY_ENV} is not set \(or is empty\)"):
        api_trainer(tmp_path, endpoint, comparator_api_key_env=KEY_ENV)  # when the trainer is built
    assert endpoint.requests == []


# ------------------------------------------------------------------------------ errors
def test_http_errors_name_the_status_the_agent_and_the_prompt_without_the_key(endpoint, key):
    endpoint.reply = lambda body: (500, {"error": f"boom: the key {key} is fine, the server is not"})
    ask = client(endpoint, comparator_api_key_env=KEY_ENV)
    with pytest.raises(
        ComparatorApiError, match=r"agent 1's prompt 2 \('hello'\): .* answered HTTP 500: .*boom"
    ) as error:
        ask.completions("hello", 1, 2, 1, SAMPLING)
    assert key not in str(error.value)
    with pytest.raises(ComparatorApiError) as error:
        ask.post({})
    shown = "".join(traceback.format_exception(error.value))
    assert "HTTP 500" in shown and key not in shown and "HTTPError" not in shown  # urllib's error holds the request
    endpoint.reply = lambda body: (402, {"error": "Insufficient Balance"})
    with pytest.raises(ComparatorApiError, match=r"HTTP 402: insufficient balance.*Insufficient Balance"):
        ask.completions("hello", 1, 2, 1, SAMPLING)


def test_a_body_that_is_not_json_is_quoted(endpoint):
    endpoint.reply = lambda body: (200, b"<html>gateway says no</html>")
    with pytest.raises(ComparatorApiError, match=r"agent 0's prompt 0 .* not JSON: <html>gateway says no</html>"):
        client(endpoint).completions("p", 0, 0, 1, SAMPLING)


@pytest.mark.parametrize(
    "api_format, answer, match",
    [
        (
            "generic",
            {"results": ["a"]},
            r"no field 'data.texts' \(nor \['completions', .*set comparator_api_response_field",
        ),
        ("openai_chat", {"error": "x"}, r"the response has no field 'choices'"),
        ("anthropic_messages", {"content": "text"}, r"the response has a non-list field 'content'"),
        ("openai_responses", {"id": "r1"}, r"the response has no field 'output'"),
    ],
)
def test_a_missing_response_field_is_named(endpoint, api_format, answer, match):
    endpoint.reply = lambda body: (200, answer)
    ask = client(endpoint, comparator_api_format=api_format, comparator_api_response_field="data.texts")
    with pytest.raises(ComparatorApiError, match=match):
        ask.completions("p", 0, 0, 1, SAMPLING)


def test_an_answer_without_completions_names_the_agent_prompt_and_count(endpoint):
    answers = iter([{"completions": ["a", "b"]}, {"completions": []}])
    endpoint.reply = lambda body: (200, next(answers))
    ask = client(endpoint, comparator_api_max_n_per_request=2)
    with pytest.raises(
        ComparatorApiError, match=r"agent 1's prompt 3 .* no completion to a request for 2 \(2 of the 4"
    ):
        ask.completions("p", 1, 3, 4, SAMPLING)


def test_an_answer_holding_a_lone_surrogate_names_the_answer_agent_and_prompt(endpoint):
    endpoint.reply = lambda body: (200, {"completions": ["fine", "half an emoji \ud83d"]})  # JSON: "\ud83d"
    with pytest.raises(
        ValueError, match=r"answer 1 of the comparator API, asked for agent 1's prompt 3 .* cannot be tokenized: "
        r"character 14 is '\\ud83d', a lone surrogate"
    ):  # fmt: skip
        client(endpoint).completions("p", 1, 3, 2, SAMPLING)


def test_timeouts_and_unreachable_endpoints_are_named(endpoint):
    def slow(body):
        threading.Event().wait(1.0)
        return 200, {"completions": ["late"]}

    endpoint.reply = slow
    with pytest.raises(ComparatorApiError, match=r"did not answer within comparator_api_timeout=0.2s"):
        client(endpoint, comparator_api_timeout=0.2).completions("p", 0, 0, 1, SAMPLING)
    closed = Endpoint()
    closed.url = "http://127.0.0.1:9/v1"  # the discard port: nothing listens
    with pytest.raises(ComparatorApiError, match=r"http://127.0.0.1:9/v1 could not be reached"):
        client(closed).completions("p", 0, 0, 1, SAMPLING)


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"comparator_api_url": None}, r"comparator_policy='api' needs comparator_api_url"),
        ({"comparator_api_url": "ftp://x"}, r"comparator_api_url must be an http:// or https:// address"),
        ({"comparator_api_format": "grpc"}, r"comparator_api_format='grpc'; expected one of \['anthropic_messages'"),
        ({"comparator_api_max_n_per_request": 0}, r"comparator_api_max_n_per_request must be an integer >= 1 or None"),
        ({"comparator_api_timeout": 0}, r"comparator_api_timeout must be a number of seconds > 0, got 0"),
        ({"comparator_api_response_field": ""}, r"comparator_api_response_field must be a non-empty string"),
        ({"comparator_api_extra_body": {"x": {1, 2}}}, r"comparator_api_extra_body must be None or a dict of JSON"),
        ({"comparator_devices": "cpu"}, r"comparator_devices='cpu': the 'api' comparator samples on its endpoint"),
        ({"comparator_policy": "current"}, r"comparator_api_url='http://.*' is only used with comparator_policy='api'"),
    ],
)
def test_bad_api_fields_are_named(endpoint, overrides, match):
    with pytest.raises(ValueError, match=match):
        api_config(endpoint, **overrides)


# ------------------------------------------------------------------------------ the answers as tokens
def api_trainer(tmp_path, endpoint, wandb_config=None, **overrides):
    values = dict(
        num_iterations=2,
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        train_batch_size=2,
        max_new_tokens=5,
        logging_steps=1,
        eval_interval=0,
        agent_learning_rate=1e-3,
        output_dir=str(tmp_path / "run"),
    )
    values.update(overrides)
    tok = char_tokenizer()
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    return MADPOIterTrainer(
        agents=agents,
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=content_score,
        args=api_config(endpoint, **values),
        wandb_config=wandb_config,
    )


def test_answers_become_the_agents_tokens_with_eos_cut_at_max_new_tokens(tmp_path, endpoint):
    endpoint.reply = lambda body: (200, {"completions": ["abc", "", "abcdefgh"]})
    madpo = api_trainer(tmp_path, endpoint)
    backend = madpo.rounds.comparator.start_round(0)
    assert madpo.rounds.comparator.state() == {}
    tok = madpo.agents.tokenizers[0]
    rollout = backend.generate(0, ["a cat", "hi"], 3, {**SAMPLING, "max_new_tokens": 5})
    eos, pad = tok.eos_token_id, tok.pad_token_id
    abc = tok("abc", add_special_tokens=False)["input_ids"]
    abcde = tok("abcde", add_special_tokens=False)["input_ids"]
    expected = [abc + [eos, pad], [eos] + [pad] * 4, abcde] * 2
    assert rollout.completion_ids.tolist() == expected
    assert rollout.lengths.tolist() == [4, 1, 5] * 2  # EOS counted, as in a sampled completion
    assert rollout.truncated.tolist() == [False, False, True] * 2
    assert rollout.texts == ["abc", "", "abcde"] * 2  # what the tokens say: the reward scores what is trained
    assert torch.equal(
        rollout.prompt_ids,
        tok(["a cat", "hi"], padding=True, padding_side="left", return_tensors="pt")["input_ids"].repeat_interleave(
            3, dim=0
        ),
    )
    assert [body["prompt"] for body in endpoint.bodies] == ["a cat", "hi"]


# ------------------------------------------------------------------------------ runs
ANSWERS = ["zqxv", "qzv", "xvzqq", "vx"]
"""The comparator's answers in the runs: words a tiny random model would not write, in the
char tokenizer's alphabet, within max_new_tokens=5 once the EOS is appended."""


def answers(body):
    return 200, {"completions": ANSWERS[: body["num_return_sequences"]]}


def comparator_sides(pairs, eos):
    """Each agent's part of each pair that the comparator wrote, as (text, ids); each must end
    with the EOS, as the agents' sampled parts that ended do."""
    sides = [
        (text, ids)
        for pair in pairs
        for texts, all_ids in ((pair.chosen_texts, pair.chosen_ids), (pair.rejected_texts, pair.rejected_ids))
        for text, ids in zip(texts, all_ids)
        if text in ANSWERS
    ]
    assert sides and all(ids[-1].item() == eos and len(ids) == len(text) + 1 for text, ids in sides)
    return sides


def every_file_under(folder):
    return [path for path in Path(folder).rglob("*") if path.is_file()]


def test_a_madpo_iter_run_with_the_api_comparator_never_writes_the_key(tmp_path, endpoint, key, fake_wandb):
    endpoint.reply = answers
    madpo = api_trainer(tmp_path, endpoint, comparator_api_key_env=KEY_ENV, wandb_config={"project": "p"})
    result = madpo.train(checkpoint_interval=1)
    assert result.global_step > 0 and madpo.rounds.round == 1
    assert all(headers["authorization"] == f"Bearer {key}" for _, headers, _ in endpoint.requests)
    assert len(endpoint.requests) == 2 * len(DATA) * 2  # rounds x prompts x agents, 4 candidates each
    run = tmp_path / "run"
    comparator_sides([pair for shard in madpo.rounds.shards for pair in shard], madpo.agents.tokenizers[0].eos_token_id)
    files = every_file_under(run)
    assert {p.name for p in files} >= {"metrics.jsonl", "samples.jsonl", "iteration_0002.json", "preference_rounds.pt"}
    assert len(list(run.glob("checkpoint-*"))) == 2
    holding = [str(path) for path in files if key.encode() in path.read_bytes()]
    assert holding == []
    assert KEY_ENV in repr(fake_wandb["init"]) and key not in repr(fake_wandb["init"]) + repr(fake_wandb["log"])


def test_a_marlhf_iter_round_with_the_api_comparator(tmp_path, endpoint, key):
    endpoint.reply = answers
    tok = char_tokenizer()
    tiny_llama(tok, 0).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    args = MARLHFIterConfig(
        comparator_policy="api",
        comparator_api_url=endpoint.url,
        comparator_api_key_env=KEY_ENV,
        num_iterations=1,
        num_train_epochs=1,
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        num_generations=2,
        max_new_tokens=5,
        logging_steps=1,
        eval_interval=0,
        agent_learning_rate=1e-3,
        reward_learning_rate=1e-3,
        reward_num_train_epochs=1,
        reward_eval_fraction=0.34,
        reward_model_name=str(tmp_path / "model"),
        output_dir=str(tmp_path / "run"),
    )
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    run = MARLHFIterTrainer(agents=agents, tokenizer=tok, train_dataset=DATA, reward_func=content_score, args=args)
    result = run.train()
    assert result.global_step == 2  # 1 round x 1 epoch x 2 steps
    assert len(endpoint.requests) == len(DATA) * 2
    comparator_sides(run.rounds.shards[0], tok.eos_token_id)
    assert not [path for path in every_file_under(tmp_path / "run") if key.encode() in path.read_bytes()]
