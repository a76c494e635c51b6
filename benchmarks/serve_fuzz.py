"""Hostile requests against `multispec serve` as a user starts it (a subprocess on localhost): random and
mutated bodies (wrong types, huge, negative and NaN numbers, unknown fields, deep JSON, long stop strings,
file paths in every field, unicode), drawn by hypothesis. Every answer must be a 2xx or a 4xx with an
OpenAI-style error object; `/health` must answer within 2 s after each; no body may hold the content of a
file on disk (a marker file is planted and its path offered in every field); the server's memory is
sampled after each request.

    python benchmarks/serve_fuzz.py --requests 5000 --out benchmarks/results/serve-fuzz

The suite runs the same checks on 500 requests (`tests/entrypoints/test_serve_fuzz.py`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from hypothesis import strategies as st

METHODS = [
    "ar",
    "beam",
    "sd",
    "sd-opt",
    "batch-sd",
    "mcsd",
    "specinfer",
    "bild",
    "mtad",
    "mjsd",
    "dsbd",
    "mtjd",
    "nope",
]
PARAMS = [
    "gamma",
    "width",
    "draft_width",
    "beam_width",
    "min_width",
    "drafts",
    "max_unchecked",
    "k_config",
    "tree",
    "drafter",
    "min_ngram",
    "max_ngram",
    "eps",
    "tau",
    "acceptance",
    "overhead",
    "factors",
    "replacement",
    "tree_attention",
    "bonus",
    "confidence",
    "rollback",
    "fallback",
    "length_penalty",
    "deterministic",
    "one_cache",
    "output",
    "resample",
    "verifier",
    "ratio",
    "threshold",
    "beam_warp",
    "adapt",
    "width_threshold",
]
FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "method",
    "method_params",
    "logprobs",
    "user",
    "tools",
]


class Planted:
    """Files whose content must never reach a client: a marker JSON file (a valid-looking tree), a FIFO (reading
    it blocks forever), and paths that do not exist."""

    def __init__(self, folder: str):
        self.marker = "MARKER-" + uuid.uuid4().hex
        self.file = os.path.join(folder, "tree.json")
        Path(self.file).write_text(json.dumps([-1, 0, 1, self.marker]))
        self.fifo = os.path.join(folder, "pipe")
        os.mkfifo(self.fifo)
        self.paths = [
            self.file,
            self.fifo,
            "/dev/zero",
            "/dev/stdin",
            "/etc/passwd",
            "/proc/self/environ",
            os.path.join(folder, "missing.json"),
            "../" * 8 + "etc/hostname",
            "~/.bashrc",
            folder,
        ]


def json_values(paths: list[str]):
    """Any JSON value, leaning towards the ones that break servers."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.sampled_from([0, -1, 1, 2**31, 2**63, 10**10, 10**30, -(10**18)]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=40),
        st.sampled_from(paths),
        st.text(alphabet=st.characters(), min_size=100, max_size=3000),
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
        max_leaves=12,
    )


def method_texts(paths: list[str]):
    value = st.one_of(
        st.sampled_from(
            [
                "1",
                "2",
                "4",
                "0",
                "-3",
                "auto",
                "10000000000",
                "4x2",
                "1x" * 300 + "1",
                "nan",
                "inf",
                "true",
                "0.5/0.2",
                "9" * 5000,
            ]
        ),
        st.sampled_from(paths),
        st.text(max_size=20),
    )
    param = st.tuples(st.sampled_from(PARAMS), value).map(lambda kv: f"{kv[0]}={kv[1]}")
    return st.tuples(st.sampled_from(METHODS), st.lists(param, max_size=3)).map(
        lambda mp: mp[0] + (":" + ",".join(mp[1]) if mp[1] else "")
    )


def method_params(paths: list[str]):
    value = st.one_of(
        json_values(paths),
        st.sampled_from([[-1, -1, 0], [[[]], []], {"parents": [-1, 0]}, list(range(-1, 300)), "auto", 10**10]),
    )
    return st.dictionaries(st.sampled_from(PARAMS), value, max_size=3)


def bodies(paths: list[str], max_tokens: int):
    """(endpoint, raw body): a valid request with a few fields mutated, a random object, or raw bytes."""
    valid_chat = st.builds(
        lambda content, stream: {
            "model": "multispec",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "stream": stream,
        },
        st.text(min_size=1, max_size=30),
        st.booleans(),
    )
    valid_text = st.builds(
        lambda prompt, stream: {"model": "multispec", "prompt": prompt, "max_tokens": max_tokens, "stream": stream},
        st.text(min_size=1, max_size=30),
        st.booleans(),
    )
    mutation = st.dictionaries(st.sampled_from(FIELDS), json_values(paths), max_size=3)
    speculation = st.fixed_dictionaries(
        {},
        optional={
            "method": method_texts(paths),
            "method_params": method_params(paths),
            "stop": st.lists(st.text(max_size=400), max_size=6),
        },
    )

    def mutated(base, change):
        body = dict(base)
        body.update(change)
        return body

    structured = st.one_of(
        st.builds(mutated, valid_chat | valid_text, mutation),
        st.builds(mutated, valid_chat | valid_text, speculation),
        st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=10), json_values(paths), max_size=6),
    ).map(lambda b: json.dumps(b).encode())
    raw = st.one_of(
        st.binary(max_size=200),
        st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),
        st.just(b'{"model": "multispec", "prompt": ' + b"9" * 6000 + b"}"),
        st.just(b'{"model": "multispec", "prompt": "' + b"a" * (2 << 20) + b'"}'),
    )
    endpoint = st.sampled_from(["/v1/completions", "/v1/chat/completions"])
    return st.tuples(endpoint, st.one_of(structured, structured, structured, raw))


class ServerProcess:
    """`multispec serve` in a subprocess on a free localhost port."""

    def __init__(self, *args: str, timeout: float = 600):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "multispec", "serve", "--port", str(self.port), "--log-level", "warning", *args],
            stdout=self.log,
            stderr=self.log,
        )
        deadline = time.time() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: {self.output()[-2000:]}")
            try:
                if self.request("GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("the server did not start in time")
            time.sleep(0.5)

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 120):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def rss(self) -> int:
        import psutil

        return psutil.Process(self.process.pid).memory_info().rss

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Fuzz:
    """One server, the planted files and the running counts; `send` checks one request's answer."""

    def __init__(self, server: ServerProcess, planted: Planted, rss_limit: int):
        self.server, self.planted, self.rss_limit = server, planted, rss_limit
        self.statuses: Counter = Counter()
        self.health_max = 0.0
        self.rss_max = server.rss()
        self.requests = 0

    def send(self, endpoint: str, body: bytes) -> None:
        try:
            status, data = self.server.request("POST", endpoint, body)
        except (BrokenPipeError, ConnectionResetError):
            # a body over the server's limit is refused before it is read: the client may still be sending it
            # when the server answers 413 and closes the connection
            assert len(body) > BODY_LIMIT, f"the connection dropped on {body[:300]!r}"
            status, data = 413, b'{"error": {"message": "", "type": "", "param": null, "code": null}}'
        self.requests += 1
        self.statuses[status] += 1
        text = data.decode(errors="replace")
        assert self.planted.marker not in text, f"a file's content in the answer to {body[:300]!r}"
        assert 200 <= status < 300 or 400 <= status < 500, f"{status} for {body[:300]!r}: {text[:300]}"
        if status >= 400:
            error = json.loads(text)["error"]
            assert {"message", "type", "param", "code"} <= set(error) and isinstance(error["message"], str)
            assert "Traceback (most recent call last)" not in text
        elif text.startswith("data:"):  # a stream: every event JSON, no server error inside
            events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
            assert events and events[-1] == "[DONE]", f"a stream that did not end: {text[-300:]}"
            for event in events[:-1]:
                assert "server_error" not in json.loads(event).get("error", {}).get("type", ""), event
        else:
            assert json.loads(text)["choices"], text[:300]
        t0 = time.perf_counter()
        health, _ = self.server.request("GET", "/health", timeout=10)
        seconds = time.perf_counter() - t0
        self.health_max = max(self.health_max, seconds)
        assert health == 200 and seconds < 2, f"/health took {seconds:.2f} s after {body[:300]!r}"
        self.rss_max = max(self.rss_max, self.server.rss())
        assert self.rss_max < self.rss_limit, f"the server holds {self.rss_max / 2**30:.2f} GiB"

    def summary(self) -> dict:
        return {
            "requests": self.requests,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "longest_health_seconds": round(self.health_max, 3),
            "peak_rss_gib": round(self.rss_max / 2**30, 3),
        }


BODY_LIMIT = 1 << 20  # the server's default
SERVER_ARGS = ["--max-tokens", "4", "--limit", "max_tokens=8", "--limit", "prompt_tokens=512"]


def main() -> int:
    from hypothesis import HealthCheck, given, settings

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--out", help="a folder for summary.json")
    ap.add_argument("--rss-gib", type=float, default=6.0, help="the memory bound the server must stay under")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        planted = Planted(folder)
        server = ServerProcess(*SERVER_ARGS)
        fuzz = Fuzz(server, planted, int(args.rss_gib * 2**30))
        t0 = time.time()
        try:

            @settings(max_examples=args.requests, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(bodies(planted.paths, 8))
            def run(case):
                fuzz.send(*case)

            run()
        finally:
            server.stop()
        summary = {
            **fuzz.summary(),
            "seconds": round(time.time() - t0, 1),
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "server": SERVER_ARGS,
        }
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
