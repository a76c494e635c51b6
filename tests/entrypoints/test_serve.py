"""`multispec serve` as its users meet it: the `openai` client and plain HTTP against a server on localhost,
over the default pair."""

import http.client
import json
import os
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
        from multispec.entrypoints.serve import Server

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

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 120):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read().decode()
        conn.close()
        return resp.status, data

    def metric(self, name: str) -> float:
        _, text = self.request("GET", "/metrics")
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name + " ") or line.startswith(name + "{")
        )

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
    from multispec.entrypoints.cli import main

    client = server.client()
    stream = client.chat.completions.create(
        model="multispec",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=24,
        seed=7,
        stream=True,
        extra_body={"method": "sd:gamma=3"},
    )
    text, last = streamed(stream)
    assert last.choices[0].finish_reason in ("stop", "length")
    spec = last.spec_decode  # the per-request speculation metrics, under vLLM's names
    assert 1 <= spec["num_drafts"] <= spec["num_draft_tokens"] <= 3 * spec["num_drafts"]
    assert spec["num_accepted_tokens"] == sum(spec["num_accepted_tokens_per_pos"])
    assert main(["generate", PROMPT, "--method", "sd:gamma=3", "--seed", "7", "--max-new-tokens", "24", "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)["text"]
    assert text == expected and text
    whole = client.chat.completions.create(
        model="multispec",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=24,
        seed=7,
        extra_body={"method": "sd:gamma=3"},
    )
    assert whole.choices[0].message.content == expected
    assert whole.choices[0].finish_reason == last.choices[0].finish_reason and whole.usage.completion_tokens >= 1


def test_completions_stop_strings_method_parameters_and_metrics(server):
    client = server.client()
    drafts_before = server.metric("vllm:spec_decode_num_drafts_total")
    free = client.completions.create(
        model="multispec",
        prompt="The three primary colours are",
        max_tokens=24,
        temperature=0,
        extra_body={"method": "mcsd", "method_params": {"k_config": "2x2"}},
    )
    text = free.choices[0].text
    assert free.method == "mcsd" and free.spec_decode["num_drafts"] >= 1
    words = text.split()
    assert len(words) >= 4, text
    stop = " " + words[2]
    stopped = client.completions.create(
        model="multispec",
        prompt="The three primary colours are",
        max_tokens=24,
        temperature=0,
        stop=[stop, "no such text"],
        extra_body={"method": "mcsd", "method_params": {"k_config": "2x2"}},
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.find(stop)]
    # streamed with the same stop: the held-back tail never leaks a part of the stop string
    stream = client.completions.create(
        model="multispec",
        prompt="The three primary colours are",
        max_tokens=24,
        temperature=0,
        stop=stop,
        stream=True,
        extra_body={"method": "mcsd", "method_params": {"k_config": "2x2"}},
    )
    assert streamed(stream)[0] == stopped.choices[0].text
    drafts = free.spec_decode["num_drafts"] + stopped.spec_decode["num_drafts"]
    assert server.metric("vllm:spec_decode_num_drafts_total") >= drafts_before + drafts
    # the batch's own figures: queue time per request, batched forwards and the rows they held
    assert server.metric("multispec_queue_seconds_count") >= 3
    forwards = server.metric("multispec_batch_forwards")
    assert forwards >= 1 and server.metric("multispec_batch_forward_rows") >= forwards
    assert server.metric("multispec_batch_rows") == 0  # nothing decodes now
    assert server.metric("multispec_batch_stall_seconds_max") <= server.metric("multispec_batch_stall_seconds")
    models = client.models.list()
    assert [m.id for m in models.data] == ["multispec"]
    status, body = server.request("GET", "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


LONG = "word " * 9000  # more tokens than the default target's context of 8192


@pytest.mark.parametrize(
    "path,body,status,needle",
    [
        ("/v1/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/completions", b"[1, 2]", 400, "JSON object"),
        ("/v1/completions", {"model": "multispec", "prompt": "hi", "method": "nope"}, 400, "unknown method 'nope'"),
        ("/v1/completions", {"model": "multispec", "prompt": "hi", "method": "sd:gamma=-2"}, 400, "gamma"),
        (
            "/v1/completions",
            {"model": "multispec", "prompt": "hi", "method": "sd", "method_params": {"colour": 1}},
            400,
            "colour",
        ),
        ("/v1/completions", {"model": "multispec", "prompt": "hi", "temperature": 3}, 400, "temperature"),
        ("/v1/completions", {"model": "multispec", "prompt": "hi", "top_p": 0}, 400, "top_p"),
        ("/v1/completions", {"model": "multispec", "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"model": "multispec", "prompt": "hi", "max_tokens": 10**6}, 400, "limit"),
        ("/v1/completions", {"model": "multispec", "prompt": LONG}, 400, "limit"),
        ("/v1/completions", {"model": "multispec", "prompt": "hi", "n": 2}, 400, "'n'"),
        ("/v1/completions", {"model": "multispec", "prompt": "hi", "seed": -1}, 400, "seed"),
        ("/v1/completions", {"model": "multispec", "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ("/v1/completions", {"model": "multispec", "prompt": "hi", "logprobs": 3}, 400, "logprobs"),
        ("/v1/completions", {"model": "multispec", "prompt": [99999999]}, 400, "vocabulary"),
        (
            "/v1/completions",
            {"model": "multispec", "prompt": "hi", "method": "dsbd", "temperature": 0},
            400,
            "temperature above 0",
        ),
        ("/v1/completions", {"model": "someone-else", "prompt": "hi"}, 404, "does not exist"),
        ("/v1/completions", {"prompt": "hi"}, 400, "'model'"),
        ("/v1/chat/completions", {"model": "multispec", "messages": []}, 400, "messages"),
        (
            "/v1/chat/completions",
            {"model": "multispec", "messages": [{"role": "wizard", "content": "hi"}]},
            400,
            "role",
        ),
        ("/v1/chat/completions", {"model": "multispec", "messages": [{"role": "user", "content": LONG}]}, 400, "limit"),
        ("/v1/embeddings", {"model": "multispec", "input": "hi"}, 404, "no route"),
    ],
)
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


@pytest.mark.parametrize("rows", [1, 2])
def test_full_queue_answers_429_and_a_client_leaving_cancels_its_generation(default_pair, server, rows):
    # the shared server is idle meanwhile; `rows` generations decode at once (2: in one batch), none may wait
    small = Running(default_pair, max_queue=0, batch_rows=rows)
    try:
        client = small.client()
        streams = [
            client.completions.create(
                model="multispec",
                prompt="Count to a thousand:",
                max_tokens=1000,
                temperature=0,  # greedy runs all 1000 (a sampled end-of-text could finish it first)
                stream=True,
                extra_body={"method": "ar"},
            )
            for _ in range(rows)
        ]
        for stream in streams:
            next(iter(stream))  # the generations are running
        with pytest.raises(openai.RateLimitError, match="busy"):
            client.completions.create(model="multispec", prompt="hi", max_tokens=4, extra_body={"method": "ar"})
        for stream in streams:
            stream.close()  # the clients leave: their 1000-token generations (minutes) must end within seconds
        deadline = time.time() + 20
        while json.loads(small.request("GET", "/health")[1])["waiting"]:
            assert time.time() < deadline, "an abandoned generation was not cancelled"
            time.sleep(0.1)
        assert small.metric("multispec_requests_cancelled_total") == rows
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
                    model="multispec",
                    messages=[{"role": "user", "content": f"Say a word about the number {r}."}],
                    max_tokens=6,
                    seed=100 * c + r,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"method": "sd:gamma=2"},
                )
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
    import multispec.api
    import multispec.entrypoints.serve
    import multispec.lockstep

    def broken(*args, **kwargs):
        raise RuntimeError("a secret internal detail")

    monkeypatch.setattr(multispec.entrypoints.serve, "generate", broken)
    monkeypatch.setattr(multispec.api, "generate", broken)  # (batched requests call it through the batch)
    monkeypatch.setattr(multispec.lockstep.Lockstep, "step", broken)  # (and chains decode in its lockstep rows)
    got, text = server.request("POST", "/v1/completions", json.dumps({"model": "multispec", "prompt": "hi"}).encode())
    assert got == 500 and json.loads(text)["error"]["message"] == "internal error (RuntimeError)"
    assert "secret" not in text and "Traceback" not in text
    got, text = server.request(
        "POST", "/v1/completions", json.dumps({"model": "multispec", "prompt": "hi", "stream": True}).encode()
    )
    assert got == 200 and "internal error (RuntimeError)" in text and "secret" not in text


def test_a_server_default_method_that_needs_a_missing_draft_is_refused(default_pair):
    from multispec.api import ModelPair
    from multispec.entrypoints.serve import Server

    with pytest.raises(ValueError, match="needs a draft model"):
        Server(ModelPair(default_pair.target, None), method="sd:gamma=3")
    with pytest.raises(ValueError, match="max_queue"):
        Server(default_pair, max_queue=-1)


def test_a_value_error_inside_generation_is_a_500_that_names_only_its_type(server, monkeypatch):
    import multispec.api
    import multispec.entrypoints.serve

    def broken(*args, **kwargs):
        raise ValueError("a secret internal detail")

    monkeypatch.setattr(multispec.entrypoints.serve, "generate", broken)
    monkeypatch.setattr(multispec.api, "generate", broken)  # (batched requests call it through the batch)
    monkeypatch.setattr(multispec.lockstep.Lockstep, "step", broken)  # (and chains decode in its lockstep rows)
    got, text = server.request("POST", "/v1/completions", json.dumps({"model": "multispec", "prompt": "hi"}).encode())
    assert got == 500 and json.loads(text)["error"]["message"] == "internal error (ValueError)"
    assert "secret" not in text


# -- hostile requests: the cases the fuzz (test_serve_fuzz.py) found or was built for ----------------------------


def _fifo_and_marker(tmp_path):
    marker = "MARKER-in-a-file-on-disk"
    tree_file = tmp_path / "tree.json"
    tree_file.write_text(json.dumps([-1, 0, marker]))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # reading it blocks until a writer comes: it held the event loop, /health included
    return marker, [str(tree_file), str(fifo), str(tmp_path / "missing.json"), "/etc/passwd"]


def test_a_request_never_names_a_file(server, tmp_path):
    marker, paths = _fifo_and_marker(tmp_path)
    messages = set()
    for path in paths:
        for body in ({"method": f"mcsd:tree={path}"}, {"method": "specinfer", "method_params": {"tree": path}}):
            body.update(model="multispec", prompt="hi", max_tokens=2)
            got, text = server.request("POST", "/v1/completions", json.dumps(body).encode(), timeout=10)
            assert got == 400 and marker not in text, text
            error = json.loads(text)["error"]
            assert "file paths are not accepted" in error["message"] and error["param"] == "method"
            messages.add(error["message"])
    assert len(messages) == 1  # the same answer whether the file exists, is readable, or is a pipe
    got, text = server.request(
        "POST",
        "/v1/completions",
        json.dumps(
            {
                "model": "multispec",
                "prompt": "hi",
                "max_tokens": 3,
                "temperature": 0,
                "method": "mcsd",
                "method_params": {"tree": [-1, -1, 0]},
            }
        ).encode(),
    )
    assert got == 200 and json.loads(text)["spec_decode"]["num_drafts"] >= 1  # a tree inline is taken


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    "body,status,needle",
    [
        ({"method": "sd:gamma=10000000000"}, 400, "gamma"),  # it built a tuple of gamma elements: memory exhausted
        ({"method": "beam", "method_params": {"width": 100000}}, 400, "width must be an integer in [1, 64]"),
        ({"method": "dsbd", "method_params": {"draft_width": 9, "beam_width": 9}}, 400, "limit of 8 (rows)"),
        ({"method": "mcsd", "method_params": {"k_config": "8x8"}}, 400, "72 nodes, above this server's limit of 64"),
        ({"method": "mcsd", "method_params": {"k_config": "1x" * 5000 + "1"}}, 400, "k_config"),
        ({"method": "batch-sd:drafts=8,gamma=16"}, 400, "128 nodes"),
        ({"method": "mcsd:k_config=9x1,tree_attention=false"}, 400, "paths"),
        ({"method": "sd", "method_params": {"gamma": 10**400}}, 400, "gamma"),
        ({"method": "sd-opt", "method_params": {"eps": float("inf")}}, 400, "eps must be a finite number"),
        ({"stop": ["x" * 129]}, 400, "'stop'"),
        ({"max_tokens": 1025}, 400, "above this server's limit of 1024"),
        ({"prompt": "word " * 5000}, 400, "above this server's limit of 4096"),
        ({"top_k": 10**30, "method": "ar"}, 200, ""),  # keeps every token: off
        ({"method": "sd:draft_vocab=100000"}, 400, "draft_vocab must be in [1, 49152]"),
        ({"method": "sd:draft_vocab=0"}, 400, "draft_vocab must be an integer >= 1"),
    ],
)
def test_sizes_are_bounded_before_any_work(server, body, status, needle):
    request = {"model": "multispec", "prompt": "hi", "max_tokens": 2, **body}
    t0 = time.perf_counter()
    got, text = server.request("POST", "/v1/completions", json.dumps(request).encode(), timeout=30)
    assert got == status, text
    assert time.perf_counter() - t0 < 10
    if status >= 400:
        assert needle in json.loads(text)["error"]["message"]


@pytest.mark.parametrize(
    "raw,status,needle",
    [
        (DEEP, 400, "nested too deeply"),
        (b'{"model": "multispec", "prompt": ' + b"9" * 6000 + b"}", 400, "not valid JSON"),
        (b'{"model": "multispec", "prompt": "' + b"a" * (1 << 20) + b'"}', 413, "larger than the limit"),
        (
            json.dumps({"model": "multispec", "messages": [{"role": "user", "content": "hi"}] * 300}).encode(),
            400,
            "300 messages",
        ),
    ],
)
def test_malformed_and_oversized_bodies_are_refused(server, raw, status, needle):
    path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
    got, text = server.request("POST", path, raw)
    assert got == status and needle in json.loads(text)["error"]["message"], text


def test_a_whole_response_is_cancelled_when_its_client_leaves(server):
    # tokens flow all the while: the disconnect was only looked for after half a second without one, so the
    # abandoned generation ran to max_tokens (minutes) and held the worker. Greedy, because sampling can end the
    # response at an end-of-text token before the client leaves (the default pair's greedy answer runs all 1000)
    cancelled = server.metric("multispec_requests_cancelled_total")
    body = json.dumps(
        {"model": "multispec", "prompt": "Count to a thousand:", "max_tokens": 1000, "temperature": 0, "method": "ar"}
    ).encode()
    conn = socket.create_connection(("127.0.0.1", server.port))
    conn.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    deadline = time.time() + 30
    while not json.loads(server.request("GET", "/health")[1])["waiting"]:
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(1.5)  # generating
    conn.close()
    left = time.time()
    while json.loads(server.request("GET", "/health")[1])["waiting"]:
        assert time.time() - left < 5, "the abandoned generation was not cancelled"
        time.sleep(0.05)
    assert server.metric("multispec_requests_cancelled_total") == cancelled + 1


def test_server_limits_are_set_per_server_and_checked(default_pair):
    from multispec.entrypoints.serve import Limits, Server

    assert Limits.parse(["gamma=4", "max-tokens=64"]) == Limits(gamma=4, max_tokens=64)
    with pytest.raises(ValueError, match="NAME one of"):
        Limits.parse(["colour=3"])
    with pytest.raises(ValueError, match="limit gamma must be an integer >= 1"):
        Limits.parse(["gamma=0"])
    with pytest.raises(ValueError, match="max_tokens must be an integer in"):
        Server(default_pair, max_tokens=200, limits=Limits(max_tokens=100))


def test_every_size_of_every_method_has_a_server_limit():
    from multispec.decoding import METHODS
    from multispec.entrypoints.serve import Limits

    for method in METHODS.values():
        for key, p in method.params.items():
            if key == "draft_vocab":  # not a size: bounded by how many distinct ones a server makes (draft_vocabs)
                continue
            if p.type in (int,) or p.high is not None:
                assert p.high is not None and key in Limits.SIZES, (method.name, key)


def test_a_server_makes_a_bounded_number_of_draft_vocabularies(default_pair):
    from multispec.entrypoints.serve import Limits, Server

    server = Server(default_pair, limits=Limits(draft_vocabs=2))
    for n in (4096, 8192, 4096):
        server._check_method("sd", {"draft_vocab": n})
    with pytest.raises(ValueError, match="at most 2 draft vocabularies"):
        server._check_method("sd", {"draft_vocab": 2048})
    server.close()


def test_a_server_drafting_with_a_feature_level_head_answers_as_greedy_ar(default_pair):
    import torch

    from multispec import generate
    from multispec.api import ModelPair
    from multispec.models.eagle import EagleDraft, new_head

    target = default_pair.target
    head = EagleDraft(new_head(target, draft_ids=torch.arange(4096), seed=0), target)
    running = Running(ModelPair(target, head))
    try:
        client = running.client()
        messages = [{"role": "user", "content": PROMPT}]
        want = generate(target, None, PROMPT, method="ar", max_new_tokens=16, temperature=0).text
        for method in ("sd:gamma=3", "mcsd:k_config=2x2"):
            out = client.chat.completions.create(
                model="multispec", messages=messages, max_tokens=16, temperature=0, extra_body={"method": method}
            )
            assert out.choices[0].message.content == want, method
            assert out.spec_decode["num_draft_tokens"] > 0
    finally:
        running.stop()


@pytest.mark.parametrize("batch_rows", [1, 4])
def test_serve_runs_the_models_on_the_main_thread_and_stops_on_a_signal(default_pair, batch_rows):
    # `multispec serve`: HTTP on a thread, every forward on the calling (main) thread, which a SIGINT stops
    import signal

    from multispec import generate
    from multispec.entrypoints.serve import Server, serve

    assert threading.current_thread() is threading.main_thread()
    # the default method's cost curves, measured once per machine (a minute on a slow host), before the client's
    # deadline starts
    generate(default_pair.target, default_pair.draft, PROMPT, max_new_tokens=2, temperature=0, score=False)
    server = Server(default_pair, batch_rows=batch_rows, driven=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    threads, answers, errors = [], [], []
    forward = type(default_pair.target).forward_rows if batch_rows > 1 else type(default_pair.target).forward

    def watched(self, *a, **k):
        threads.append(threading.current_thread() is threading.main_thread())
        return forward(self, *a, **k)

    def client():
        try:
            deadline = time.time() + 60
            while True:
                try:
                    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
                    out = c.chat.completions.create(
                        model="multispec", messages=[{"role": "user", "content": PROMPT}], max_tokens=6, temperature=0
                    )
                    answers.append(out.choices[0].message.content)
                    break
                except openai.APIConnectionError:
                    assert time.time() < deadline, "the server did not start"
                    time.sleep(0.1)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    name = "forward_rows" if batch_rows > 1 else "forward"
    original = getattr(type(default_pair.target), name)
    setattr(type(default_pair.target), name, watched)
    try:
        t = threading.Thread(target=client)
        t.start()
        assert serve(server, port=port, log_level="warning") == 0
        t.join(30)
    finally:
        setattr(type(default_pair.target), name, original)
    assert not errors and answers and answers[0]
    assert threads and all(threads)  # every forward of the request ran on the main thread
