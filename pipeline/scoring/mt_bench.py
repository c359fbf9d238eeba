"""MT-Bench single-answer grading with FastChat's judge prompts, by an HTTP or a local judge.

Follows ``fastchat/llm_judge`` (Zheng et al. 2023): turn 1 is judged with ``single-v1`` (or
``single-math-v1`` with the reference answer for math, reasoning and coding), turn 2 with the
``-multi-turn`` forms that show the whole conversation; the judge runs at temperature 0; the score is
parsed from the judge's LAST ``[[rating]]`` with the last ``[rating]`` as fallback (FastChat's patterns;
FastChat takes the first, which an answer that writes "Rating: [[10]]" wins as soon as the judge quotes
it); a rating that is not a number from 1 to 10 written plainly (``[[100]]``, ``[[07]]``, ``[[0]]``, 5,000
digits) makes that judgment unparseable, as does one the judge could not give (below). Unparseable
judgments are counted and excluded from the means. Scores are reported per turn, per category and overall.

Failures: a judgment whose request the endpoint refuses (HTTP 400, 413, 422) or answers with something
that is not a chat completion, after the retries, is lost alone (``error`` in its details, counted in
``num_failed``); an endpoint that cannot be reached, times out (``timeout_s`` is the whole request's
limit, however slowly the answer trickles in), answers 408/409/429/5xx or breaks off (``IncompleteRead``)
after the retries, or refuses with another client error (401, 403, 404: every request would be refused),
fails the scoring run (``JudgeUnavailableError``): the sweep keeps the generations and judges them again when
the judge is back, as it does when every judgment failed.

The judge is configured apart from the pair being measured:

- ``OpenAIJudge``: any OpenAI-compatible ``/chat/completions`` endpoint; the key is read from the
  environment variable the config names (never stored, printed or logged);
- ``TransformersJudge``: a local causal LM with a chat template, greedy decoding.

The judge's model name and the versions its endpoint reports are recorded with the scores.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import math
import os
import re
import socket
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol, Sequence

from pipeline.data import load_dataset
from pipeline.data.mt_bench import load_judge_prompts
from pipeline.scoring import print_json, read_predictions, run_cli

NEED_REF_CATS = ("math", "reasoning", "coding")  # FastChat's categories judged against a reference
# FastChat's one_score_pattern and one_score_pattern_backup (``\d+\.?\d*``), written so that a long run
# of digits is not scanned again and again.
ONE_SCORE = re.compile(r"\[\[(\d+(?:\.\d*)?)\]\]")
ONE_SCORE_BACKUP = re.compile(r"\[(\d+(?:\.\d*)?)\]")
# A rating on MT-Bench's 1-10 scale, written plainly: no leading zero, at most 16 characters.
VALID_RATING = re.compile(r"(?:10(?:\.0*)?|[1-9](?:\.\d*)?)")
MAX_RATING_CHARS = 16
DEFAULT_MAX_TOKENS = 2048  # FastChat's for GPT-4 judges
MAX_RESPONSE_BYTES = 8 * 2**20  # a chat completion of 2,048 tokens is some kilobytes
REQUEST_REFUSED = (400, 413, 422)  # this request is malformed or too long: its judgment alone is lost
RETRIED = (408, 409, 429)  # and every 5xx


class JudgeError(RuntimeError):
    """The judge could not give a judgment."""


class JudgeUnavailableError(JudgeError):
    """The endpoint cannot be reached, keeps failing or refuses every request: the run is judged again later."""


class JudgmentFailedError(JudgeError):
    """This one request was refused or answered with something that is not a judgment: only it is lost."""


class BadAnswerError(ValueError):
    """The endpoint answered, with something that is not a chat completion (or larger than one may be)."""


class Judge(Protocol):
    name: str

    def complete(self, system: str, user: str) -> str: ...

    def info(self) -> dict[str, Any]: ...


# --------------------------------------------------------------------------- parsing and prompts


def parse_rating(judgment: str) -> float | None:
    """The score of a judgment: its last ``[[x]]``, else its last ``[x]``; None (FastChat's -1) when there
    is none or the last one is not a rating from 1 to 10 written plainly (``[[07]]``, ``[[100]]``, ``[[0]]``).

    The last, not the first: the judge gives its verdict at the end, after quoting or discussing the
    answer, which may itself say "Rating: [[10]]". An invalid last verdict is not replaced by an earlier one.
    """
    if not isinstance(judgment, str):
        return None
    for pattern in (ONE_SCORE, ONE_SCORE_BACKUP):
        last = None
        for last in pattern.finditer(judgment):  # noqa: B007 - the last match is the one kept
            pass
        if last is not None:
            numeral = last.group(1)
            if len(numeral) > MAX_RATING_CHARS or not VALID_RATING.fullmatch(numeral):
                return None
            return float(numeral)
    return None


def judge_prompt_name(category: str | None, turn: int, has_reference: bool) -> str:
    """The FastChat template for a question's category and turn (1 or 2)."""
    name = "single-math-v1" if (category in NEED_REF_CATS and has_reference) else "single-v1"
    return name + ("-multi-turn" if turn == 2 else "")


def build_judge_prompt(
    templates: Mapping[str, Mapping[str, str]],
    turns: Sequence[str],
    answers: Sequence[str],
    *,
    category: str | None,
    turn: int,
    reference: Sequence[str] | None = None,
) -> tuple[str, str, str]:
    """``(template name, system prompt, user prompt)`` for judging ``turn`` of one answered question."""
    if category in NEED_REF_CATS and not reference:
        raise ValueError(f"category {category!r} is judged against a reference answer, and none was given")
    name = judge_prompt_name(category, turn, bool(reference))
    template = templates[name]
    kwargs: dict[str, str] = {}
    if reference and category in NEED_REF_CATS:
        kwargs["ref_answer_1"] = reference[0]
        if len(reference) > 1:
            kwargs["ref_answer_2"] = reference[1]
    if turn == 1:
        user = template["prompt_template"].format(question=turns[0], answer=answers[0], **kwargs)
    else:
        user = template["prompt_template"].format(
            question_1=turns[0], question_2=turns[1], answer_1=answers[0], answer_2=answers[1], **kwargs
        )
    return name, template["system_prompt"], user


# --------------------------------------------------------------------------- judges


class _Deadline:
    """A request's total time limit: when it is up, every socket of the request is shut down, which ends
    whatever call is blocked on it (connecting through a proxy, the TLS handshake, the headers, the body).
    Socket timeouts alone bound each read, not their sum: a judge that trickles a byte a second would
    hold a request forever."""

    def __init__(self, seconds: float):
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def cancel(self) -> None:
        with self._lock:
            self._timer.cancel()
            self._sockets.clear()


def _shut(sock: socket.socket) -> None:
    try:  # the plain socket's shutdown, also for a TLS socket (no TLS close-notify from this thread)
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # closed already, or never connected


class _HTTPConnection(http.client.HTTPConnection):
    """An HTTP connection whose sockets a :class:`_Deadline` watches from the moment they connect."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._deadline = deadline
        self._create_connection = self._watched_connection

    def _watched_connection(self, *args: Any, **kwargs: Any) -> socket.socket:
        sock = socket.create_connection(*args, **kwargs)
        self._deadline.watch(sock)
        return sock


class _HTTPSConnection(http.client.HTTPSConnection):
    """Likewise over TLS: the TLS socket is watched before its handshake."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._deadline = deadline
        self._create_connection = self._watched_connection

    _watched_connection = _HTTPConnection._watched_connection

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP, and the proxy's CONNECT tunnel when there is one
        sock = self._context.wrap_socket(
            self.sock, server_hostname=self._tunnel_host or self.host, do_handshake_on_connect=False
        )
        self._deadline.watch(sock)  # the plain socket was detached by the wrap: this one holds the descriptor
        sock.do_handshake()
        self.sock = sock


def http_request(
    url: str,
    headers: Mapping[str, str],
    timeout_s: float,
    payload: Mapping[str, Any] | None = None,
    max_bytes: int = MAX_RESPONSE_BYTES,
) -> tuple[int, str, bytes]:
    """POST ``payload`` as JSON (GET without one); ``(status, reason, body)`` within ``timeout_s`` in all
    (``TimeoutError`` otherwise), a body of at most ``max_bytes`` (``BadAnswerError`` beyond). Proxies as
    urllib takes them from the environment (``https_proxy``, ``http_proxy``, ``no_proxy``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"judge URL {url!r} is not an http:// or https:// URL")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    headers = dict(headers)
    proxy = None if urllib.request.proxy_bypass(parts.hostname) else urllib.request.getproxies().get(parts.scheme)
    deadline = _Deadline(timeout_s)
    kind = _HTTPSConnection if parts.scheme == "https" else _HTTPConnection
    if proxy:
        proxy_parts = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        proxy_headers = {}
        if proxy_parts.username:
            login = f"{urllib.parse.unquote(proxy_parts.username)}:{urllib.parse.unquote(proxy_parts.password or '')}"
            proxy_headers["Proxy-Authorization"] = "Basic " + base64.b64encode(login.encode()).decode()
        if parts.scheme == "https":
            conn = kind(proxy_parts.hostname, proxy_parts.port or 8080, timeout=timeout_s, deadline=deadline)
            conn.set_tunnel(parts.hostname, parts.port or 443, headers=proxy_headers)
        else:
            conn = kind(proxy_parts.hostname, proxy_parts.port or 8080, timeout=timeout_s, deadline=deadline)
            target, headers = url, {**headers, **proxy_headers}
    else:
        conn = kind(parts.hostname, parts.port, timeout=timeout_s, deadline=deadline)
    try:
        if payload is None:
            conn.request("GET", target, headers=headers)
        else:
            conn.request("POST", target, body=json.dumps(payload).encode(), headers=headers)
        response = conn.getresponse()
        if response.length is not None and response.length > max_bytes:
            raise BadAnswerError(f"the answer is larger than {max_bytes} bytes ({response.length})")
        # With a Content-Length, read() without a size raises IncompleteRead when the answer breaks off
        # (read(n) would return the part silently); without one (chunked, or to the end), at most max_bytes + 1.
        body = response.read() if response.length is not None else response.read(max_bytes + 1)
        if deadline.expired:
            raise TimeoutError(f"no complete answer within {timeout_s} s")
        if len(body) > max_bytes:
            raise BadAnswerError(f"the answer is larger than {max_bytes} bytes")
        return response.status, response.reason, body
    except (OSError, http.client.HTTPException) as err:
        if deadline.expired:
            raise TimeoutError(f"no complete answer within {timeout_s} s") from None
        raise err
    finally:
        deadline.cancel()
        conn.close()


def _content(body: bytes) -> tuple[str, str]:
    """(the judgment, the model version reported) of a chat completion; BadAnswerError when it is not one."""
    try:
        payload = json.loads(body)
        content = payload["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise BadAnswerError(f"not a chat completion ({type(err).__name__}: {str(err)[:200]})") from None
    if content is None:
        content = ""  # a refusal or a tool call: no rating in it
    if not isinstance(content, str):
        raise BadAnswerError(f"not a chat completion (its content is a JSON {type(content).__name__}, not text)")
    version = str(payload.get("model") or "")[:200]
    fingerprint = payload.get("system_fingerprint")
    if fingerprint:
        version += f" ({str(fingerprint)[:200]})"
    return content, version


@dataclass
class OpenAIJudge:
    """A judge behind an OpenAI-compatible HTTP endpoint (``base_url`` up to ``/v1``).

    ``timeout_s`` bounds each request as a whole (connecting, sending, the answer to its last byte);
    transient failures (not reachable, timeouts, a broken-off answer, HTTP 408/409/429/5xx, an answer that
    is not a chat completion) are retried ``max_retries`` times, waiting ``retry_sleep_s`` doubled each time.
    """

    base_url: str
    model: str
    api_key_env: str | None = "OPENAI_API_KEY"
    temperature: float = 0.0
    max_tokens: int = DEFAULT_MAX_TOKENS
    timeout_s: float = 120.0
    max_retries: int = 5
    retry_sleep_s: float = 2.0
    versions: set[str] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        def number(name: str, value: Any, low: float, integer: bool = False) -> None:
            ok = (isinstance(value, int) if integer else isinstance(value, (int, float))) and not isinstance(
                value, bool
            )
            if not (ok and math.isfinite(value) and value >= low):
                kind = "an integer" if integer else "a finite number"
                raise ValueError(f"judge.{name} must be {kind} >= {low} (got {value!r})")

        number("timeout_s", self.timeout_s, 1e-3)
        number("max_retries", self.max_retries, 0, integer=True)
        number("retry_sleep_s", self.retry_sleep_s, 0)
        number("max_new_tokens", self.max_tokens, 1, integer=True)
        number("temperature", self.temperature, 0)
        parts = urllib.parse.urlsplit(str(self.base_url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"judge.base_url must be an http:// or https:// URL up to /v1 (got {self.base_url!r})")

    @property
    def name(self) -> str:
        return self.model

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def complete(self, system: str, user: str) -> str:
        payload = {
            "model": self.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "n": 1,
        }
        url = self.base_url.rstrip("/") + "/chat/completions"
        last_error, bad_answer = "", False
        for attempt in range(self.max_retries + 1):
            try:
                status, reason, body = http_request(url, self._headers(), self.timeout_s, payload)
            except (OSError, http.client.HTTPException, BadAnswerError) as err:  # TimeoutError, IncompleteRead, TLS...
                last_error, bad_answer = f"{type(err).__name__}: {err}", isinstance(err, BadAnswerError)
            else:
                if status in REQUEST_REFUSED:
                    raise JudgmentFailedError(f"judge endpoint {url} refused this request: HTTP {status} {reason}")
                if 400 <= status < 500 and status not in RETRIED:  # 401, 403, 404...: every request would be refused
                    raise JudgeUnavailableError(
                        f"judge endpoint {url} failed after {attempt + 1} attempt(s): HTTP {status} {reason}"
                    )
                if status >= 400:
                    last_error, bad_answer = f"HTTP {status} {reason}", False
                else:
                    try:
                        judgment, version = _content(body)
                    except BadAnswerError as err:
                        last_error, bad_answer = str(err), True
                    else:
                        self.versions.add(version or self.model)
                        return judgment
            if attempt < self.max_retries:
                time.sleep(self.retry_sleep_s * (2**attempt))
        failure = JudgmentFailedError if bad_answer else JudgeUnavailableError
        raise failure(f"judge endpoint {url} failed after {self.max_retries + 1} attempt(s): {last_error}")

    def info(self) -> dict[str, Any]:
        return {
            "kind": "openai",
            "model": self.model,
            "base_url": self.base_url,
            "versions_reported": sorted(self.versions),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }


class TransformersJudge:
    """A local causal LM as judge: chat template, greedy decoding, ``max_new_tokens`` per judgment."""

    def __init__(self, model: Any, tokenizer: Any, name: str, max_new_tokens: int = 512):
        self.model, self.tokenizer, self.name, self.max_new_tokens = model, tokenizer, name, max_new_tokens

    @classmethod
    def from_spec(
        cls, spec: str | Mapping[str, Any], *, dtype: str = "float32", device: str = "auto", max_new_tokens: int = 512
    ) -> "TransformersJudge":
        """From a pair name (its target model), a Hub id / local directory, or a model spec mapping."""
        from pipeline import models  # noqa: PLC0415 - the local judge only: torch + transformers (~4 s) not paid by the HTTP judge's CLI

        if isinstance(spec, str):
            try:
                cfg = models.pair_config(spec)
                model_spec = models.ModelSpec.from_config(cfg["target"])
                dtype = cfg.get("dtype", dtype)
            except ValueError:
                model_spec = models.ModelSpec(id=spec)
        else:
            model_spec = models.ModelSpec.from_config(spec)
        tokenizer = models.load_tokenizer(model_spec)
        model = models.load_model(model_spec, dtype, device)
        return cls(model, tokenizer, model_spec.id, max_new_tokens)

    def complete(self, system: str, user: str) -> str:
        import torch  # noqa: PLC0415 - the local judge only (as above)

        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"].to(self.model.device)
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            )
        return self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    def info(self) -> dict[str, Any]:
        return {"kind": "transformers", "model": self.name, "max_new_tokens": self.max_new_tokens, "decoding": "greedy"}


OPENAI_KEYS = (
    "base_url",
    "model",
    "api_key_env",
    "temperature",
    "max_tokens",
    "timeout_s",
    "max_retries",
    "retry_sleep_s",
)
TRANSFORMERS_KEYS = ("model", "dtype", "device", "max_new_tokens")
# Where the judge is reached, not what judges: left out of the judge's identity (a moved endpoint
# serving the same model does not re-judge anything).
JUDGE_LOCATION_KEYS = ("base_url", "api_key_env", "timeout_s", "max_retries", "retry_sleep_s", "device", "enabled")


def _judge_kwargs(cfg: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(kind, constructor keyword arguments) of a judge config; one length setting for both kinds.

    ``max_new_tokens`` (the config's name, the local judge's) and ``max_tokens`` (the OpenAI API's) are
    the same setting: each judge gets it under its own name. Unknown keys are an error naming the valid ones.
    """
    cfg = {k: v for k, v in dict(cfg).items() if k != "enabled" and v is not None}
    kind = cfg.pop("kind", "openai")
    if kind == "openai":
        if "max_new_tokens" in cfg:
            cfg["max_tokens"] = cfg.pop("max_new_tokens")
        valid = OPENAI_KEYS
    elif kind == "transformers":
        if "max_tokens" in cfg:
            cfg["max_new_tokens"] = cfg.pop("max_tokens")
        for k in ("base_url", "api_key_env", "timeout_s", "max_retries", "retry_sleep_s", "temperature"):
            cfg.pop(k, None)  # endpoint settings left in the config from an openai judge: unused here
        valid = TRANSFORMERS_KEYS
    else:
        raise ValueError(f"unknown judge kind {kind!r}; valid: openai, transformers (set judge.kind)")
    unknown = sorted(set(cfg) - set(valid))
    if unknown:
        raise ValueError(f"judge (kind={kind}): unknown setting(s) {unknown}; valid: {list(valid)} plus max_new_tokens")
    if kind == "openai":
        missing = [k for k in ("base_url", "model") if not cfg.get(k)]
        if missing:
            raise ValueError(
                f"judge.kind=openai needs {missing}: set judge.base_url=http://host:port/v1 judge.model=<served model name>"
            )
        OpenAIJudge(**cfg)  # its settings checked (numbers finite and in range, the URL's scheme); nothing is sent
    return kind, cfg


def make_judge(cfg: Mapping[str, Any]) -> Judge:
    """A judge from its config: ``{kind: openai, base_url, model, api_key_env, max_new_tokens}`` or ``{kind: transformers, model, max_new_tokens}``."""
    kind, kwargs = _judge_kwargs(cfg)
    if kind == "openai":
        return OpenAIJudge(**kwargs)
    return TransformersJudge.from_spec(kwargs.pop("model"), **kwargs)


def judge_identity(cfg: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What makes two judges' scores comparable (kind, model, length, temperature); None when disabled."""
    if not cfg or not cfg.get("enabled"):
        return None
    kind, kwargs = _judge_kwargs(cfg)
    out = {"kind": kind, **{k: v for k, v in kwargs.items() if k not in JUDGE_LOCATION_KEYS}}
    if "max_tokens" in out:
        out["max_new_tokens"] = out.pop("max_tokens")
    return out


def preflight(cfg: Mapping[str, Any] | None) -> str | None:
    """Before any model loads: an enabled OpenAI-compatible judge must answer ``/models``; its base URL
    (None: nothing to reach). ValueError naming the fix otherwise."""
    if not cfg or not cfg.get("enabled"):
        return None
    kind, kwargs = _judge_kwargs(cfg)
    if kind != "openai":
        return None
    check_endpoint(kwargs["base_url"], kwargs.get("api_key_env", "OPENAI_API_KEY"), kwargs.get("model"))
    return kwargs["base_url"]


def check_endpoint(
    base_url: str, api_key_env: str | None = "OPENAI_API_KEY", model: str | None = None, timeout_s: float = 5.0
) -> list[str]:
    """GET ``{base_url}/models`` once within ``timeout_s`` in all; the served model ids, or ValueError naming the fix."""
    url = base_url.rstrip("/") + "/models"
    headers = {}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    fix = (
        "start the OpenAI-compatible server, or set judge.base_url to where it listens (up to /v1), "
        "or judge.enabled=false / judge.kind=transformers"
    )
    try:
        status, reason, body = http_request(url, headers, timeout_s)  # timeout_s for the whole request
    except (OSError, http.client.HTTPException, BadAnswerError) as err:
        raise ValueError(
            f"judge endpoint {url} is not reachable ({type(err).__name__}: {getattr(err, 'reason', err)}): {fix}"
        ) from None
    if status >= 400:
        hint = f" (the key in ${api_key_env} is missing or wrong)" if status in (401, 403) else ""
        raise ValueError(f"judge endpoint {url} answered HTTP {status} {reason}{hint}: {fix}")
    try:
        payload = json.loads(body or b"{}")
        models = payload.get("data") or []
        served = [str(m.get("id"))[:200] for m in models if isinstance(m, Mapping)]
    except (ValueError, AttributeError, TypeError) as err:
        raise ValueError(
            f"judge endpoint {url} did not answer with a model list ({type(err).__name__}): {fix}"
        ) from None
    if model and served and model not in served:
        raise ValueError(
            f"judge endpoint {url} does not serve model {model!r} (it serves {served}): set judge.model to one of them"
        )
    return served


# --------------------------------------------------------------------------- scoring


def _answers(prediction: Any) -> list[str]:
    if isinstance(prediction, str):
        return [prediction]
    if isinstance(prediction, Mapping) and "turns" in prediction:
        return list(prediction["turns"])
    return list(prediction)


def judge_predictions(
    predictions: Iterable[Mapping[str, Any]],
    samples: Mapping[str, Any],
    judge: Judge,
    templates: Mapping[str, Mapping[str, str]],
    *,
    turns: Sequence[int] = (1, 2),
    workers: int = 1,
) -> dict[str, Any]:
    """Judge each answered question's turns; per-turn, per-category and overall means of valid scores.

    ``predictions``: ``id`` (question_id) and ``prediction`` (the list of answers, one per turn).
    ``samples``: MT-Bench samples by id (``pipeline.data.mt_bench``).
    """
    jobs = []
    for pred in predictions:
        sid = str(pred["id"])
        if sid not in samples:
            raise KeyError(f"unknown MT-Bench question id {sid!r}")
        sample = samples[sid]
        answers = _answers(pred["prediction"])
        for turn in turns:
            if turn > len(answers):
                raise ValueError(f"question {sid}: turn {turn} asked but {len(answers)} answer(s) given")
            name, system, user = build_judge_prompt(
                templates, sample.turns, answers, category=sample.category, turn=turn, reference=sample.reference
            )
            jobs.append((sid, sample.category, turn, name, system, user))

    def run(job):
        sid, category, turn, name, system, user = job
        error = None
        try:
            judgment = judge.complete(system, user)
        except JudgmentFailedError as err:  # this judgment alone is lost
            judgment, error = "", str(err)
        if not isinstance(judgment, str):
            judgment, error = "", f"the judge returned a {type(judgment).__name__}, not text"
        return {
            "id": sid,
            "category": category,
            "turn": turn,
            "judge_prompt": name,
            "score": None if error else parse_rating(judgment),
            "judgment": judgment,
            "error": error,
        }

    if workers > 1 and len(jobs) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(run, job) for job in jobs]
            wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f.done() and not f.cancelled() and f.exception() is not None), None)
            if failed is not None:  # the judge is gone: the requests not yet sent are not sent
                pool.shutdown(wait=True, cancel_futures=True)
                raise failed.exception()
            details = [f.result() for f in futures]
    else:
        details = [run(job) for job in jobs]
    errors = [d["error"] for d in details if d["error"]]
    if details and len(errors) == len(details):
        raise JudgeUnavailableError(
            f"the judge gave none of the {len(details)} judgment(s); the first failure: {errors[0]}"
        )
    return summarize(details, judge.info())


def summarize(details: list[dict[str, Any]], judge_info: Mapping[str, Any]) -> dict[str, Any]:
    """Means over parsed scores (unparseable judgments, failed ones included, counted and excluded)."""
    valid = [d for d in details if d["score"] is not None]

    def avg(rows):
        return sum(r["score"] for r in rows) / len(rows) if rows else float("nan")

    categories = sorted({d["category"] for d in details if d["category"] is not None})
    turn_ids = sorted({d["turn"] for d in details})
    return {
        "metric": "mt_bench_score",
        "score": avg(valid),
        "per_turn": {str(t): avg([d for d in valid if d["turn"] == t]) for t in turn_ids},
        "per_category": {c: avg([d for d in valid if d["category"] == c]) for c in categories},
        "num_judgments": len(details),
        "num_unparseable": len(details) - len(valid),
        "num_failed": sum(bool(d.get("error")) for d in details),
        "judge": dict(judge_info),
        "details": details,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data", default=None, help="MT-Bench folder (question.jsonl, reference_answer/, judge_prompts.jsonl)"
    )
    parser.add_argument(
        "--predictions", required=True, help="JSONL of {id: question_id, prediction: [answer1, answer2]}"
    )
    parser.add_argument("--judge-prompts", default=None, help="FastChat judge_prompts.jsonl (default: next to --data)")
    judge = parser.add_mutually_exclusive_group(required=True)
    judge.add_argument("--judge-url", help="OpenAI-compatible base URL, e.g. https://api.openai.com/v1")
    judge.add_argument("--judge-local", help="local judge: a pair name (its target), a Hub id or a model folder")
    parser.add_argument("--judge-model", default="gpt-4", help="model name sent to the endpoint")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the key")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="local judge: tokens per judgment")
    parser.add_argument("--turns", default="1,2")
    parser.add_argument("--workers", type=int, default=4, help="parallel requests (HTTP judge)")
    args = parser.parse_args(argv)
    samples = {s.id: s for s in load_dataset("mt_bench", args.data)}
    templates = load_judge_prompts(args.judge_prompts or args.data)
    if args.judge_url:
        the_judge: Judge = OpenAIJudge(args.judge_url, args.judge_model, args.api_key_env)
        workers = args.workers
    else:
        the_judge = TransformersJudge.from_spec(args.judge_local, max_new_tokens=args.max_new_tokens)
        workers = 1
    result = judge_predictions(
        read_predictions(args.predictions),
        samples,
        the_judge,
        templates,
        turns=[int(t) for t in args.turns.split(",")],
        workers=workers,
    )
    print_json(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
