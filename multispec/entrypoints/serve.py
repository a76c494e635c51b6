"""An OpenAI-compatible HTTP server over one model pair: `/v1/chat/completions`, `/v1/completions` (whole or
streamed as server-sent events), `/v1/models`, `/health` and `/metrics` (Prometheus text).

Up to `batch_rows` requests decode together (continuous batching, `multispec.batching`: one row of the
models' batch caches each, one forward per model over the rows; rows join and leave between forwards); with
`batch_rows` 1, or models without a static cache, one at a time. The others wait, in arrival order, in a
bounded queue, and a full queue answers 429.
A client that disconnects cancels its generation, streamed or whole, at the next iteration. Every refusal is
an OpenAI-style error object with a 4xx status; an unexpected failure is a 500 whose body names only the
exception's type (the traceback goes to the server's log).

Requests come from other programs and people: a request never names a file (a tree is given inline), and
every size it may ask for is bounded (`Limits`) and checked before any work.

Glossary of the speculation metrics (vLLM's names, so its dashboards read them): a *draft* is one
proposal verified by one target call; *draft tokens* are the positions proposed (a tree counts its
depth); *accepted tokens* those the target kept; *accepted per position* counts, for each draft position,
the iterations that accepted it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
import uuid
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..api import ModelPair, generate, validate_request
from ..params import DEFAULT_METHOD, parse_method, short_repr
from ..streaming import TextStream

log = logging.getLogger("multispec.entrypoints.serve")

DEFAULT_MAX_TOKENS = 128  # as `multispec generate`
MAX_BATCH_ROWS = 64  # requests decoded together at most (`--batch-rows`)
MAX_BATCH_CAPACITY = 2048  # entries a batched request's cache row holds; a longer request runs beside the batch
# fields of OpenAI's requests this server does not implement: refused when set to anything but their no-op
UNSUPPORTED = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "tools": (None, []),
    "response_format": (None, {"type": "text"}),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, checked before any work (`multispec serve --limit NAME=N`). The defaults
    keep the default pair's largest request within a few GB (cache rows x tokens) on a 24 GiB machine."""

    body_bytes: int = 1 << 20  # the request body
    prompt_tokens: int = 4096  # the prompt, tokenised (the context bounds prompt + max_tokens too)
    max_tokens: int = 1024  # new tokens a request may ask for
    messages: int = 256  # chat messages in one request
    stop_strings: int = 4  # as OpenAI's API
    stop_length: int = 128  # characters in one stop string
    tree_nodes: int = 64  # draft nodes of a tree or k-config
    gamma: int = 16  # draft positions per target call (gamma)
    max_unchecked: int = 32  # bild's draft tokens before a check
    rows: int = 8  # beams or draft chains (width, draft_width, beam_width, min_width, drafts; paths when
    #                a tree is scored one row per path)
    ngram: int = 16  # a copying drafter's n-gram lengths (min_ngram, max_ngram)
    draft_vocabs: int = 4  # distinct reduced draft vocabularies (draft_vocab=N) one server makes: each holds a cut
    #                        copy of the draft's head and measures its own cost curve

    # the method parameters each size limit bounds (every sized parameter of the registry has one)
    SIZES = {
        "gamma": "gamma",
        "max_unchecked": "max_unchecked",
        "width": "rows",
        "draft_width": "rows",
        "beam_width": "rows",
        "min_width": "rows",
        "drafts": "rows",
        "min_ngram": "ngram",
        "max_ngram": "ngram",
    }

    def __post_init__(self):
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"limit {name} must be an integer >= 1, got {value!r}")

    @classmethod
    def parse(cls, items: list[str] | None) -> Limits:
        """['gamma=8', 'max_tokens=512'] -> Limits with those changed (dashes in names may be underscores)."""
        changed = {}
        for item in items or []:
            name, sep, value = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in cls.__dataclass_fields__:
                raise ValueError(
                    f"--limit takes NAME=N with NAME one of {', '.join(cls.__dataclass_fields__)}; got {item!r}"
                )
            try:
                changed[name] = int(value)
            except ValueError:
                raise ValueError(f"--limit {name} must be an integer >= 1, got {value.strip()!r}") from None
        return cls(**changed)


class RequestError(Exception):
    """A request this server refuses: HTTP status and an OpenAI-style error object."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Job:
    """One request's generation, as the worker thread runs it."""

    prompt_ids: list[int]
    method: str
    params: dict[str, Any]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # ("text", piece), then ("done", ...) or ("error", e)
    cancel: threading.Event = field(default_factory=threading.Event)
    queued: float = 0.0  # seconds from arrival until a worker thread took it (then a batch row: the stats')
    arrived: float = field(default_factory=time.perf_counter)

    def emit(self, kind: str, value: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Metrics:
    """The server's Prometheus counters, on a registry of its own (several servers may live in one process)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Draft proposals verified", registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft positions proposed", registry=r)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.accepted_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by draft position",
            ["position"],
            registry=r,
        )
        self.requests = Counter(
            "multispec_requests", "Requests answered, by endpoint and HTTP status", ["endpoint", "status"], registry=r
        )
        self.cancelled = Counter("multispec_requests_cancelled", "Generations ended by a client leaving", registry=r)
        self.prompt_tokens = Counter("multispec_prompt_tokens", "Prompt tokens of served requests", registry=r)
        self.generation_tokens = Counter("multispec_generation_tokens", "Tokens generated", registry=r)
        self.waiting = Gauge("multispec_requests_waiting", "Requests queued or running", registry=r)
        self.latency = Histogram(
            "multispec_request_seconds",
            "Time from arrival to the last token",
            registry=r,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.queue = Histogram(
            "multispec_queue_seconds",
            "Time from arrival until a request decodes (a batch row is free)",
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )

    def watch(self, batcher) -> None:
        """Gauges read from the batch (`multispec.batching.Batcher`) when scraped."""
        from prometheus_client import Gauge

        r = self.registry
        Gauge("multispec_batch_rows", "Sequences decoding in the batch now", registry=r).set_function(
            lambda: batcher.active_rows
        )
        Gauge("multispec_batch_forwards", "Batched forwards so far", registry=r).set_function(
            lambda: batcher.stats["forwards"]
        )
        Gauge(
            "multispec_batch_forward_rows",
            "Rows those forwards held (over multispec_batch_forwards: the mean batch size)",
            registry=r,
        ).set_function(lambda: batcher.stats["rows"])
        Gauge(
            "multispec_batch_stall_seconds",
            "Seconds the decoding rows waited for forwards run alone (several-row methods, long requests), in all",
            registry=r,
        ).set_function(lambda: batcher.stats["stall_seconds"])
        Gauge("multispec_batch_stall_seconds_max", "The longest such wait", registry=r).set_function(
            lambda: batcher.stats["stall_max"]
        )
        Gauge(
            "multispec_batch_prefill_chunks",
            "Prompts' chunks fed in batched forwards (beside the decoding rows)",
            registry=r,
        ).set_function(lambda: batcher.stats["prefill_chunks"])

    def count(self, spec: dict) -> None:
        self.drafts.inc(spec["num_drafts"])
        self.draft_tokens.inc(spec["num_draft_tokens"])
        self.accepted.inc(spec["num_accepted_tokens"])
        for i, n in enumerate(spec["num_accepted_tokens_per_pos"]):
            self.accepted_per_pos.labels(position=str(i)).inc(n)


def speculation(stats: dict) -> dict:
    """One generation's speculation metrics, under vLLM's names (see the module's glossary)."""
    return {
        "num_drafts": sum(stats.get("accepted_length_histogram") or []),
        "num_draft_tokens": stats.get("drafted", 0),
        "num_accepted_tokens": stats.get("accepted", 0),
        "num_accepted_tokens_per_pos": list(stats.get("accepted_per_position") or []),
        "acceptance_rate": stats.get("acceptance_rate"),
        "target_calls": stats.get("target_calls"),
        "block_efficiency": stats.get("block_efficiency"),
        "seconds": stats.get("seconds"),
    }


class Server:
    """The application (`self.app`, ASGI) over one model pair."""

    def __init__(
        self,
        pair: ModelPair,
        *,
        model_name: str = "multispec",
        method: str = DEFAULT_METHOD,
        max_queue: int = 16,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        limits: Limits | None = None,
        batch_rows: int = 8,
        driven: bool = False,
    ):
        """`driven`: the models' work (every forward) waits for `drive()`, called from the main thread (`serve`
        does; see `Batcher.drive` for why); otherwise it runs on threads of its own."""
        self.limits = limits = limits or Limits()
        self.draft_vocabs: set[int] = set()  # the draft_vocab sizes requests have asked for (at most draft_vocabs)
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0:
            raise ValueError(f"max_queue must be an integer >= 0, got {max_queue!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= limits.max_tokens:
            raise ValueError(
                f"max_tokens must be an integer in [1, {limits.max_tokens}] (the max_tokens limit), got {max_tokens!r}"
            )
        if pair.target.tokenizer is None:
            raise ValueError(f"{pair.target.name} has no tokenizer: a text server needs one")
        self.pair, self.model_name = pair, model_name
        self.default_method, self.default_params = parse_method(method)
        self._check_method(self.default_method, self.default_params, files=True)
        self.max_queue, self.max_tokens = max_queue, max_tokens
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or not 1 <= batch_rows <= MAX_BATCH_ROWS:
            raise ValueError(f"batch_rows must be an integer in [1, {MAX_BATCH_ROWS}], got {batch_rows!r}")
        self.tokenizer_lock = threading.Lock()  # a fast tokenizer is not to be used by two threads at once
        # up to `batch_rows` requests decode together (`multispec.batching`), where both models have a static cache
        self.batcher = None
        if batch_rows > 1 and all(getattr(m, "static", False) for m in (pair.target, pair.draft) if m is not None):
            from ..batching import Batcher

            capacity = min(MAX_BATCH_CAPACITY, limits.prompt_tokens + limits.max_tokens + limits.tree_nodes)
            self.batcher = Batcher(
                pair.target,
                pair.draft,
                rows=batch_rows,
                capacity=capacity,
                tokenizer_lock=self.tokenizer_lock,
                scheduler=not driven,
            )
        self.rows = batch_rows if self.batcher is not None else 1
        # a batch's rows run on threads (their forwards on the batch's scheduler); one sequence at a time runs on
        # the driving thread where the server is driven
        self.executor = (
            MainThreadExecutor()
            if driven and self.batcher is None
            else ThreadPoolExecutor(self.rows, thread_name_prefix="multispec-generate")
        )
        self.in_flight = 0  # queued or running
        self.created = int(time.time())
        self.metrics = Metrics()
        if self.batcher is not None:
            self.metrics.watch(self.batcher)
        self.app = self._build_app()

    # -- the ASGI application -----------------------------------------------------------------------------

    def _build_app(self):
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.routing import Route

        async def http_error(request, exc: HTTPException):
            status = exc.status_code
            message = {
                404: f"no route {request.url.path}",
                405: f"{request.method} is not allowed on {request.url.path}",
            }.get(status, str(exc.detail))
            return self._error(request, RequestError(status, message, code={404: "not_found"}.get(status)))

        async def server_error(request, exc: Exception):
            log.exception("unexpected failure on %s", request.url.path)
            return self._error(
                request, RequestError(500, f"internal error ({type(exc).__name__})", kind="server_error")
            )

        routes = [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", self._health, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
        ]
        return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})

    def _error(self, request, e: RequestError):
        from starlette.responses import JSONResponse

        self.metrics.requests.labels(endpoint=request.url.path, status=str(e.status)).inc()
        return JSONResponse(e.body(), status_code=e.status)

    async def _health(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok", "waiting": self.in_flight})

    async def _metrics(self, request):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        from starlette.responses import Response

        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def _models(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "multispec",
                        "root": self.pair.target.name,
                        "max_model_len": self.pair.target.max_length,
                    }
                ],
            }
        )

    async def _chat(self, request):
        return await self._serve(request, chat=True)

    async def _completions(self, request):
        return await self._serve(request, chat=False)

    async def _serve(self, request, chat: bool):
        from starlette.responses import JSONResponse, StreamingResponse

        arrived = time.perf_counter()
        try:
            body = await self._json(request)
            job, stream, include_usage = self._job(body, chat)
        except RequestError as e:
            return self._error(request, e)
        if self.in_flight >= self.max_queue + self.rows:  # `rows` running and max_queue waiting
            return self._error(
                request,
                RequestError(
                    429,
                    f"the server is busy: {self.in_flight} requests are queued or running (at most "
                    f"{self.max_queue + self.rows}); retry later",
                    code="queue_full",
                    kind="rate_limit_error",
                ),
            )
        self.in_flight += 1
        self.metrics.waiting.set(self.in_flight)
        future = asyncio.wrap_future(self.executor.submit(self._run, job))
        future.add_done_callback(lambda _: self._finished())
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if stream:
            events = self._events(request, job, future, ident, chat, include_usage, arrived)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        watcher = asyncio.create_task(self._watch(request, job))
        try:
            result, text = await self._wait(job)
        except RequestError as e:
            return self._error(request, e)
        finally:
            watcher.cancel()
        if result is None:  # the client left; nobody reads this
            return JSONResponse({}, status_code=499)
        self._account(request, job, result, arrived)
        return JSONResponse(self._whole(ident, chat, job, result, text))

    def _finished(self) -> None:
        self.in_flight -= 1
        self.metrics.waiting.set(self.in_flight)

    async def _json(self, request) -> dict:
        limit = self.limits.body_bytes
        declared = request.headers.get("content-length", "")
        too_long = RequestError(
            413, f"the request body is larger than the limit of {limit} bytes", code="body_too_large"
        )
        if declared.isdigit() and int(declared) > limit:
            raise too_long
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_long
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except RecursionError:
            raise RequestError(
                400, "the request body is not valid JSON: nested too deeply", code="invalid_json"
            ) from None
        except ValueError as e:  # (JSONDecodeError, UnicodeDecodeError, an integer of too many digits)
            raise RequestError(
                400, f"the request body is not valid JSON: {str(e)[:200]}", code="invalid_json"
            ) from None
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object", code="invalid_json")
        return body

    # -- one request ------------------------------------------------------------------------------------

    def _job(self, body: dict, chat: bool) -> tuple[Job, bool, bool]:
        """The request checked and tokenised, before it waits for its turn."""
        model = body.get("model")
        if model is None:
            raise RequestError(400, "the request has no 'model'", param="model")
        if model != self.model_name:
            raise RequestError(
                404,
                f"the model {short_repr(model)} does not exist here; this server serves "
                f"{self.model_name!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
            )
        for key, allowed in UNSUPPORTED.items():
            if body.get(key, None) not in allowed:
                raise RequestError(
                    400, f"'{key}' is not supported by this server", param=key, code="unsupported_parameter"
                )
        n = body.get("n", 1)
        if n != 1:
            raise RequestError(400, f"'n' must be 1 (one choice per request), got {short_repr(n)}", param="n")
        stream = _boolean(body, "stream", False)
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise RequestError(400, "'stream_options' must be an object", param="stream_options")
        include_usage = bool(options.get("include_usage", False))

        temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
        if top_p <= 0:
            raise RequestError(400, f"'top_p' must be in (0, 1], got {top_p!r}", param="top_p")
        top_k = body.get("top_k", 0)
        if top_k == -1:  # vLLM's "off"
            top_k = 0
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise RequestError(
                400, f"'top_k' must be an integer >= 0 (or -1: off), got {short_repr(top_k)}", param="top_k"
            )
        if top_k >= self.pair.target.vocab_size:  # keeps every token: off
            top_k = 0
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
            raise RequestError(400, f"'seed' must be an integer in [0, 2**63), got {short_repr(seed)}", param="seed")
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        limits = self.limits
        if (
            not isinstance(stop, list)
            or len(stop) > limits.stop_strings
            or not all(isinstance(s, str) and 0 < len(s) <= limits.stop_length for s in stop)
        ):
            raise RequestError(
                400,
                f"'stop' must be a string or a list of at most {limits.stop_strings} of them, "
                f"each of 1 to {limits.stop_length} characters; got {short_repr(stop)}",
                param="stop",
            )
        method, params = self._method(body)

        prompt_ids = self._prompt_ids(body, chat)
        where = "messages" if chat else "prompt"
        if not prompt_ids:
            raise RequestError(400, "the prompt is empty after tokenisation", param=where)
        if len(prompt_ids) > limits.prompt_tokens:
            raise RequestError(
                400,
                f"the prompt has {len(prompt_ids)} tokens, above this server's limit of {limits.prompt_tokens}",
                param=where,
                code="context_length_exceeded",
            )
        room = self.pair.target.max_length
        if self.pair.draft is not None and self.pair.draft.max_length is not None:
            room = min(room, self.pair.draft.max_length) if room is not None else self.pair.draft.max_length
        left = None if room is None else room - len(prompt_ids)
        if left is not None and left < 1:
            raise RequestError(
                400,
                f"this model's context is {room} tokens; the prompt has {len(prompt_ids)}, "
                "which leaves no room for an answer",
                param="messages" if chat else "prompt",
                code="context_length_exceeded",
            )
        key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = body.get(key)
        if max_tokens is None:
            max_tokens = self.max_tokens if left is None else min(self.max_tokens, left)
        elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError(400, f"'{key}' must be an integer >= 1, got {short_repr(max_tokens)}", param=key)
        elif max_tokens > limits.max_tokens:
            raise RequestError(
                400, f"'{key}' is {max_tokens}, above this server's limit of {limits.max_tokens}", param=key
            )
        elif left is not None and max_tokens > left:
            raise RequestError(
                400,
                f"this model's context is {room} tokens; the prompt has {len(prompt_ids)} and "
                f"'{key}' asks for {max_tokens}: at most {left} fit",
                param=key,
                code="context_length_exceeded",
            )
        try:
            validate_request(method, max_tokens, temperature, top_k, top_p, params, seed, files=False)
        except ValueError as e:
            raise RequestError(400, str(e), param="method") from None
        job = Job(
            prompt_ids, method, params, max_tokens, temperature, top_p, top_k, seed, stop, asyncio.get_running_loop()
        )
        return job, stream, include_usage

    def _method(self, body: dict) -> tuple[str, dict]:
        spec = body.get("method")
        extra = body.get("method_params") or {}
        if not isinstance(extra, dict):
            raise RequestError(
                400, "'method_params' must be an object of parameter names and values", param="method_params"
            )
        if spec is None:
            method, params = self.default_method, dict(self.default_params)
        elif not isinstance(spec, str) or not spec.strip():
            raise RequestError(
                400,
                f"'method' must be a method name, parameters after a colon (sd:gamma=4); got {short_repr(spec)}",
                param="method",
            )
        else:
            try:
                method, params = parse_method(spec)
            except ValueError as e:
                raise RequestError(400, str(e), param="method") from None
        params.update(extra)
        try:
            self._check_method(method, params)
        except ValueError as e:
            raise RequestError(400, str(e), param="method") from None
        return method, params

    def _check_method(self, method: str, params: dict, files: bool = False) -> None:
        """A method this server runs, with parameters within its limits; ValueError naming the problem. A
        request's parameters never name files (`files`: the server's own default method may)."""
        from ..decoding import get_method

        spec = get_method(method)
        if spec.markov_only:
            raise ValueError(f"method {method!r} runs only on MarkovLM test models")
        resolved = spec.resolve(params, files=files)
        if spec.draft_use(resolved) == "required" and self.pair.draft is None:
            raise ValueError(f"method {method!r} needs a draft model and this server has none")
        self._check_sizes(spec, resolved)

    def _check_sizes(self, spec, params: dict) -> None:
        from ..decoding.tree import as_tree
        from ..trees import TokenTree, parse_k_config

        limits = self.limits
        for key, p in spec.params.items():
            value = params.get(key)
            if p.high is not None and isinstance(value, int):
                name = Limits.SIZES.get(key, "")
                high = getattr(limits, name, p.high)
                if value > high:
                    raise ValueError(
                        f"{key} is {value}, above this server's limit of {high}"
                        + (f" ({name})" if name and name != key else "")
                    )
        vocab = params.get("draft_vocab")
        if vocab is not None and vocab not in self.draft_vocabs:
            if len(self.draft_vocabs) >= limits.draft_vocabs:
                raise ValueError(
                    f"draft_vocab={vocab}: this server makes at most {limits.draft_vocabs} draft vocabularies "
                    f"(draft_vocabs), and has made {', '.join(map(str, sorted(self.draft_vocabs)))}; use one of them"
                )
            if self.pair.draft is not None and not 1 <= vocab <= self.pair.draft.vocab_size:
                raise ValueError(f"draft_vocab must be in [1, {self.pair.draft.vocab_size}], got {vocab}")
            self.draft_vocabs.add(vocab)
        tree = params.get("tree")
        if tree is not None and tree != "auto":
            tree = as_tree(tree)
        elif params.get("k_config") is not None:
            tree = TokenTree.from_branching(parse_k_config(params["k_config"]))
        if isinstance(tree, TokenTree):
            if tree.size > limits.tree_nodes:
                raise ValueError(
                    f"the tree has {tree.size} nodes, above this server's limit of {limits.tree_nodes} (tree_nodes)"
                )
            paths = len(tree.leaves())
            if params.get("tree_attention") is False and paths > limits.rows:
                raise ValueError(
                    f"scored one row per path (tree_attention=false), the tree's {paths} paths are "
                    f"above this server's limit of {limits.rows} rows"
                )
        if params.get("drafts") is not None and isinstance(params.get("gamma"), int):  # batch-sd: M chains
            nodes = params["drafts"] * params["gamma"]
            if nodes > limits.tree_nodes:
                raise ValueError(
                    f"{params['drafts']} chains of {params['gamma']} are {nodes} nodes, above this "
                    f"server's limit of {limits.tree_nodes} (tree_nodes)"
                )

    def _prompt_ids(self, body: dict, chat: bool) -> list[int]:
        target = self.pair.target
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RequestError(400, "'messages' must be a non-empty list", param="messages")
            if len(messages) > self.limits.messages:
                raise RequestError(
                    400,
                    f"{len(messages)} messages are above this server's limit of {self.limits.messages}",
                    param="messages",
                )
            conversation = [_message(m, i) for i, m in enumerate(messages)]
            try:
                with self.tokenizer_lock:
                    return target.encode_chat(conversation)
            except ValueError as e:
                raise RequestError(400, str(e), param="messages") from None
            except Exception as e:  # a template that raises on this conversation (e.g. roles out of order)
                raise RequestError(400, f"the chat template refused these messages: {e}", param="messages") from None
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise RequestError(400, "'prompt' is empty", param="prompt")
            with self.tokenizer_lock:
                return target.encode(prompt, chat=False)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < target.vocab_size]
            if bad:
                raise RequestError(
                    400, f"prompt token id {bad[0]} is outside the vocabulary of {target.vocab_size}", param="prompt"
                )
            return list(prompt)
        raise RequestError(
            400, "'prompt' must be a string or a list of token ids (one prompt per request)", param="prompt"
        )

    def _run(self, job: Job):
        """On the worker thread: generate, sending text pieces to the request as they are committed."""
        job.queued = time.perf_counter() - job.arrived
        try:
            if job.cancel.is_set():  # the client left while the request waited
                job.emit("done", (None, ""))
                return
            text = TextStream(self._decode, job.stop)

            def on_tokens(tokens: list[int]) -> bool:
                piece = text.push(tokens)
                if piece:
                    job.emit("text", piece)
                return text.stopped

            run = (
                self.batcher.generate
                if self.batcher is not None
                else partial(generate, self.pair.target, self.pair.draft)
            )
            result = run(
                job.prompt_ids,
                method=job.method,
                max_new_tokens=job.max_tokens,
                temperature=job.temperature,
                top_k=job.top_k,
                top_p=job.top_p,
                seed=job.seed,
                on_tokens=on_tokens,
                score=False,
                cancel=job.cancel,
                **job.params,
            )
            rest = text.finish()
            if rest:
                job.emit("text", rest)
            job.emit("done", (result, text.text))
        except Exception as e:  # a request is checked in whole before it runs: what fails here is the server's
            if job.cancel.is_set() and type(e).__name__ == "Cancelled":  # the client left while it waited for a row
                job.emit("done", (None, ""))
                return
            log.exception("generation failed")
            job.emit("error", RequestError(500, f"internal error ({type(e).__name__})", kind="server_error"))

    def _decode(self, ids: list[int]) -> str:
        with self.tokenizer_lock:
            return self.pair.target.decode(ids) or ""

    async def _wait(self, job: Job):
        """A whole response: (result, text), or (None, "") when the client left (`_watch`)."""
        while True:
            kind, value = await job.events.get()
            if kind == "error":
                raise value
            if kind == "done":
                return value
            if kind == "gone":
                return None, ""

    async def _watch(self, request, job: Job) -> None:
        """Until cancelled: when the client of a whole response disconnects, cancel its generation (the worker
        stops at its next iteration). Its body has been read, so the next message is the disconnect."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.cancel.set()
                self.metrics.cancelled.inc()
                job.events.put_nowait(("gone", None))
                return

    async def _events(self, request, job: Job, future, ident: str, chat: bool, include_usage: bool, arrived: float):
        """Server-sent events of a streamed response; leaving early (the client closed) cancels the job."""
        finished = False
        try:
            if chat:
                yield _sse(self._chunk(ident, chat, {"role": "assistant", "content": ""}, None))
            while True:
                kind, value = await job.events.get()
                if kind == "text":
                    yield _sse(self._chunk(ident, chat, value, None))
                    continue
                if kind == "error":
                    finished = True
                    self.metrics.requests.labels(endpoint=request.url.path, status=str(value.status)).inc()
                    yield _sse(value.body())
                    break
                result, _ = value
                finished = True
                if result is None:
                    break
                self._account(request, job, result, arrived)
                last = self._chunk(ident, chat, "" if not chat else {}, _finish_reason(result.stats))
                last["spec_decode"] = speculation(result.stats)
                last["method"] = job.method
                if result.stats.get("fallbacks"):
                    last["fallbacks"] = result.stats["fallbacks"]
                yield _sse(last)
                if include_usage:
                    usage = self._chunk(ident, chat, None, None)
                    usage["choices"] = []
                    usage["usage"] = _usage(job, result)
                    yield _sse(usage)
                break
            yield "data: [DONE]\n\n"
        finally:
            if not finished:
                job.cancel.set()
                self.metrics.cancelled.inc()

    def _account(self, request, job: Job, result, arrived: float) -> None:
        m = self.metrics
        m.requests.labels(endpoint=request.url.path, status="200").inc()
        m.prompt_tokens.inc(len(job.prompt_ids))
        m.generation_tokens.inc(len(result.token_ids))
        m.count(speculation(result.stats))
        m.latency.observe(time.perf_counter() - arrived)
        m.queue.observe(job.queued + (result.stats.get("queue_seconds") or 0.0))

    def _chunk(self, ident: str, chat: bool, delta, finish: str | None) -> dict:
        if chat:
            choice = {
                "index": 0,
                "delta": {"content": delta} if isinstance(delta, str) else (delta or {}),
                "logprobs": None,
                "finish_reason": finish,
            }
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        return {"id": ident, "object": obj, "created": int(time.time()), "model": self.model_name, "choices": [choice]}

    def _whole(self, ident: str, chat: bool, job: Job, result, text: str) -> dict:
        finish = _finish_reason(result.stats)
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        out = {
            "id": ident,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": _usage(job, result),
            "method": job.method,
            "spec_decode": speculation(result.stats),
        }
        if result.stats.get("fallbacks"):  # this request's steps ran uncompiled or uncaptured after a failure
            out["fallbacks"] = result.stats["fallbacks"]
        return out

    def warm_up(self) -> None:
        """One short generation, so that the first request does not pay for lazy initialisation."""
        ids = self.pair.target.encode("Hello", chat=False)
        generate(
            self.pair.target,
            self.pair.draft,
            ids,
            method=self.default_method,
            max_new_tokens=4,
            score=False,
            **self.default_params,
        )

    def drive(self) -> None:
        """Run the models' work in this thread until `stop()` (a server made with driven=True)."""
        if self.batcher is not None:
            self.batcher.drive()
        else:
            self.executor.drive()

    def stop(self) -> None:
        """`drive()` returns once the work under way has ended (from any thread)."""
        if self.batcher is not None:
            self.batcher.close()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.batcher is not None:
            self.batcher.close()


class MainThreadExecutor(Executor):
    """An executor whose work runs, one piece at a time, on the thread that calls `drive` (the main thread:
    see `Batcher.drive`)."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._stopped = False

    def submit(self, fn, /, *args, **kwargs) -> Future:
        if self._stopped:
            raise RuntimeError("the server is stopping")
        future: Future = Future()
        self._jobs.put((future, fn, args, kwargs))
        return future

    def drive(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=0.5)  # (a timeout, so that Ctrl-C is seen while idle)
            except queue.Empty:
                if self._stopped:
                    return
                continue
            if job is None:
                return
            future, fn, args, kwargs = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except Exception as e:  # noqa: BLE001 - the request's own error, reported to it
                future.set_exception(e)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._stopped = True
        if cancel_futures:
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
        self._jobs.put(None)


def _sse(obj: dict) -> str:
    return "data: " + json.dumps(obj) + "\n\n"


def _usage(job: Job, result) -> dict:
    n = len(result.token_ids)
    return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": n, "total_tokens": len(job.prompt_ids) + n}


def _finish_reason(stats: dict) -> str:
    return "length" if stats.get("stopped") in ("length", "context") else "stop"


def _boolean(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(400, f"'{key}' must be true or false, got {short_repr(value)}", param=key)
    return value


def _number(body: dict, key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RequestError(400, f"'{key}' must be a number in [{low:g}, {high:g}], got {short_repr(value)}", param=key)
    return float(value)


def _message(m, i: int) -> dict:
    if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
        raise RequestError(
            400,
            f"messages[{i}] must be an object with a role (system, user or assistant) and content",
            param=f"messages[{i}]",
        )
    content = m.get("content")
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise RequestError(400, f"messages[{i}]: only text content parts are supported", param=f"messages[{i}]")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise RequestError(400, f"messages[{i}].content must be a string", param=f"messages[{i}].content")
    role = "system" if m["role"] == "developer" else m["role"]
    return {"role": role, "content": content}


def serve(server: Server, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> int:
    """Warm the server up and run it until interrupted (Ctrl-C, SIGTERM): HTTP (uvicorn) on a thread, the
    models' work on this one (a server made with driven=True, called from the main thread). Returns 0, or 1
    where the HTTP server did not start (the port taken)."""
    import signal

    import uvicorn

    server.warm_up()
    web = uvicorn.Server(uvicorn.Config(server.app, host=host, port=port, log_level=log_level))
    http = threading.Thread(target=web.run, name="multispec-http", daemon=True)

    def stopped_serving():
        http.join()
        server.stop()

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    # both, as uvicorn does on the main thread (a shell starts a background job with SIGINT ignored)
    before = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    http.start()
    threading.Thread(target=stopped_serving, name="multispec-http-watch", daemon=True).start()
    try:
        server.drive()
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        web.should_exit = True
        http.join(timeout=30)
        server.close()
    return 0 if web.started else 1
