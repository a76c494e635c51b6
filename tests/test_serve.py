"""`multispec serve` as its users meet it: the `openai` client and plain HTTP against a server on localhost,
over the default pair."""

import http.client
import json
import socket
import statistics
import threading
import time

import openai  # the dev extra installs it; the server's own libraries are dependencies
import pytest
import uvicorn

pytestmark = pytest.mark.slow

PROMPT = "Name three colours."


class Running:
    """A server on a free localhost port, in a thread, for the duration of a test module."""

    def __init__(self, pair, **options):
        from multispec.serve import Server

        self.server = Server(pair, **options)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(self.server.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.uvicorn.started:
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.05)

    def client(self, **kw):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0, **kw)

    def request(self, method: str, path: str, body: bytes | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read().decode()
        conn.close()
        return resp.status, data

    def metric(self, name: str) -> float:
        _, text = self.request("GET", "/metrics")
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + " ") or line.startswith(name + "{"))

    def stop(self):
        self.uvicorn.should_exit = True
        self.thread.join(timeout=30)
        self.server.close()


@pytest.fixture(scope="module")
def server(default_pair):
    running = Running(default_pair)
    yield running
    running.stop()


def streamed(stream) -> tuple[str, object]:
    parts, last = [], None
    for chunk in stream:
        if chunk.choices:
            choice = chunk.choices[0]
            parts.append((choice.delta.content if hasattr(choice, "delta") else choice.text) or "")
            last = chunk
    return "".join(parts), last


def test_chat_streamed_equals_multispec_generate(server, capsys):
    from multispec.cli import main

    client = server.client()
    stream = client.chat.completions.create(
        model="multispec", messages=[{"role": "user", "content": PROMPT}], max_tokens=24, seed=7, stream=True,
        extra_body={"method": "sd:gamma=3"})
    text, last = streamed(stream)
    assert last.choices[0].finish_reason in ("stop", "length")
    spec = last.spec_decode  # the per-request speculation metrics, under vLLM's names
    assert 1 <= spec["num_drafts"] <= spec["num_draft_tokens"] <= 3 * spec["num_drafts"]
    assert spec["num_accepted_tokens"] == sum(spec["num_accepted_tokens_per_pos"])
    assert main(["generate", PROMPT, "--method", "sd:gamma=3", "--seed", "7", "--max-new-tokens", "24",
                 "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)["text"]
    assert text == expected and text
    whole = client.chat.completions.create(model="multispec", messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=24, seed=7, extra_body={"method": "sd:gamma=3"})
    assert whole.choices[0].message.content == expected
    assert whole.choices[0].finish_reason == last.choices[0].finish_reason and whole.usage.completion_tokens >= 1


def test_completions_stop_strings_method_parameters_and_metrics(server):
    client = server.client()
    drafts_before = server.metric("vllm:spec_decode_num_drafts_total")
    free = client.completions.create(model="multispec", prompt="The three primary colours are", max_tokens=24,
                                     temperature=0, extra_body={"method": "mcsd", "method_params": {"k_config": "2x2"}})
    text = free.choices[0].text
    assert free.method == "mcsd" and free.spec_decode["num_drafts"] >= 1
    words = text.split()
    assert len(words) >= 4, text
    stop = " " + words[2]
    stopped = client.completions.create(model="multispec", prompt="The three primary colours are", max_tokens=24,
                                        temperature=0, stop=[stop, "no such text"],
                                        extra_body={"method": "mcsd", "method_params": {"k_config": "2x2"}})
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.find(stop)]
    # streamed with the same stop: the held-back tail never leaks a part of the stop string
    stream = client.completions.create(model="multispec", prompt="The three primary colours are", max_tokens=24,
                                       temperature=0, stop=stop, stream=True,
                                       extra_body={"method": "mcsd", "method_params": {"k_config": "2x2"}})
    assert streamed(stream)[0] == stopped.choices[0].text
    drafts = free.spec_decode["num_drafts"] + stopped.spec_decode["num_drafts"]
    assert server.metric("vllm:spec_decode_num_drafts_total") >= drafts_before + drafts
    models = client.models.list()
    assert [m.id for m in models.data] == ["multispec"]
    status, body = server.request("GET", "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


LONG = "word " * 9000  # more tokens than the default target's context of 8192


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, "JSON object"),
    ("/v1/completions", {"model": "multispec", "prompt": "hi", "method": "nope"}, 400, "unknown method 'nope'"),
    ("/v1/completions", {"model": "multispec", "prompt": "hi", "method": "sd:gamma=-2"}, 400, "gamma"),
    ("/v1/completions", {"model": "multispec", "prompt": "hi", "method": "sd", "method_params": {"colour": 1}},
     400, "colour"),
    ("/v1/completions", {"model": "multispec", "prompt": "hi", "temperature": 3}, 400, "temperature"),
    ("/v1/completions", {"model": "multispec", "prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": "multispec", "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": "multispec", "prompt": "hi", "max_tokens": 10**6}, 400, "context"),
    ("/v1/completions", {"model": "multispec", "prompt": LONG}, 400, "context"),
    ("/v1/completions", {"model": "multispec", "prompt": "hi", "n": 2}, 400, "'n'"),
    ("/v1/completions", {"model": "multispec", "prompt": "hi", "seed": -1}, 400, "seed"),
    ("/v1/completions", {"model": "multispec", "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("/v1/completions", {"model": "multispec", "prompt": "hi", "logprobs": 3}, 400, "logprobs"),
    ("/v1/completions", {"model": "multispec", "prompt": [99999999]}, 400, "vocabulary"),
    ("/v1/completions", {"model": "multispec", "prompt": "hi", "method": "dsbd", "temperature": 0}, 400,
     "temperature above 0"),
    ("/v1/completions", {"model": "someone-else", "prompt": "hi"}, 404, "does not exist"),
    ("/v1/completions", {"prompt": "hi"}, 400, "'model'"),
    ("/v1/chat/completions", {"model": "multispec", "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": "multispec", "messages": [{"role": "wizard", "content": "hi"}]}, 400,
     "role"),
    ("/v1/chat/completions", {"model": "multispec", "messages": [{"role": "user", "content": LONG}]}, 400,
     "context"),
    ("/v1/embeddings", {"model": "multispec", "input": "hi"}, 404, "no route"),
])
def test_bad_requests_get_a_clear_4xx(server, path, body, status, needle):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got, text = server.request("POST", path, raw)
    assert got == status, text
    error = json.loads(text)["error"]
    assert needle in error["message"] and "Traceback" not in text
    assert error["type"] in ("invalid_request_error", "rate_limit_error")


def test_wrong_http_method_and_openai_client_errors(server):
    got, text = server.request("GET", "/v1/completions")
    assert got == 405 and "not allowed" in json.loads(text)["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="unknown method"):
        server.client().completions.create(model="multispec", prompt="hi", extra_body={"method": "nope"})


def test_full_queue_answers_429_and_a_client_leaving_cancels_its_generation(default_pair, server):
    small = Running(default_pair, max_queue=0)  # the shared server is idle meanwhile: one generation at a time
    try:
        client = small.client()
        stream = client.completions.create(model="multispec", prompt="Count to a thousand:", max_tokens=4000,
                                           temperature=1, stream=True, extra_body={"method": "ar"})
        next(iter(stream))  # the generation is running
        with pytest.raises(openai.RateLimitError, match="busy"):
            client.completions.create(model="multispec", prompt="hi", max_tokens=4, extra_body={"method": "ar"})
        stream.close()  # the client leaves: its 4000-token generation (minutes) must end within seconds
        deadline = time.time() + 20
        while json.loads(small.request("GET", "/health")[1])["waiting"]:
            assert time.time() < deadline, "the abandoned generation was not cancelled"
            time.sleep(0.1)
        assert small.metric("multispec_requests_cancelled_total") == 1
        done = client.completions.create(model="multispec", prompt="hi", max_tokens=4, extra_body={"method": "ar"})
        assert done.usage.completion_tokens >= 1
    finally:
        small.stop()


def test_load_8_streaming_clients_x_4_requests(server):
    # the 8 x 10 load is measured by benchmarks/serve_load.py; here 8 x 4 keeps the suite short
    clients, per_client = 8, 4
    served_before = server.metric("multispec_requests_total")
    results: dict[int, list] = {c: [] for c in range(clients)}
    errors: list[BaseException] = []

    def one_client(c: int):
        client = server.client(timeout=600)
        try:
            for r in range(per_client):
                t0 = time.perf_counter()
                stream = client.chat.completions.create(
                    model="multispec", messages=[{"role": "user", "content": f"Say a word about the number {r}."}],
                    max_tokens=6, seed=100 * c + r, stream=True, stream_options={"include_usage": True},
                    extra_body={"method": "sd:gamma=2"})
                parts, finish, usage = [], None, None
                for chunk in stream:
                    if chunk.choices:
                        parts.append(chunk.choices[0].delta.content or "")
                        finish = chunk.choices[0].finish_reason or finish
                    if chunk.usage is not None:
                        usage = chunk.usage
                results[c].append((r, "".join(parts), finish, usage, time.perf_counter() - t0))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one_client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert not errors, errors
    latencies = []
    for c in range(clients):
        assert [r for r, *_ in results[c]] == list(range(per_client))  # every response, in its client's order
        for _, _, finish, usage, seconds in results[c]:
            assert finish in ("stop", "length") and usage is not None and 1 <= usage.completion_tokens <= 6
            latencies.append(seconds)
    assert server.metric("multispec_requests_total") == served_before + clients * per_client  # none lost
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    print(f"\nload {clients}x{per_client}: latency p50 {q[49]:.2f} s, p90 {q[89]:.2f} s, p99 {q[98]:.2f} s")


def test_a_failure_inside_generation_is_a_500_without_traceback(server, monkeypatch):
    import multispec.serve

    def broken(*args, **kwargs):
        raise RuntimeError("a secret internal detail")

    monkeypatch.setattr(multispec.serve, "generate", broken)
    got, text = server.request("POST", "/v1/completions", json.dumps({"model": "multispec", "prompt": "hi"}).encode())
    assert got == 500 and json.loads(text)["error"]["message"] == "internal error (RuntimeError)"
    assert "secret" not in text and "Traceback" not in text
    got, text = server.request("POST", "/v1/completions",
                               json.dumps({"model": "multispec", "prompt": "hi", "stream": True}).encode())
    assert got == 200 and "internal error (RuntimeError)" in text and "secret" not in text


def test_a_server_default_method_that_needs_a_missing_draft_is_refused(default_pair):
    from multispec.api import ModelPair
    from multispec.serve import Server

    with pytest.raises(ValueError, match="needs a draft model"):
        Server(ModelPair(default_pair.target, None), method="sd:gamma=3")
    with pytest.raises(ValueError, match="max_queue"):
        Server(default_pair, max_queue=-1)
