"""MT-Bench's judges: an OpenAI-compatible HTTP endpoint or a local model, and their configuration.

- ``OpenAIJudge``: any OpenAI-compatible ``/chat/completions`` endpoint; the key is read from the
  environment variable the config names (never stored, printed or logged);
- ``TransformersJudge``: a local causal LM with a chat template, greedy decoding.

Failures: a judgment whose request the endpoint refuses (HTTP 400, 413, 422) or answers with something
that is not a chat completion, after the retries, is lost alone (``JudgmentFailedError``); an endpoint
that cannot be reached, times out (``timeout_s`` is the whole request's limit, however slowly the answer
trickles in), answers 408/409/429/5xx or breaks off (``IncompleteRead``) after the retries, or refuses
with another client error (401, 403, 404: every request would be refused), fails the scoring run
(``JudgeUnavailableError``). The scorer itself is ``pipeline.scoring.mt_bench``.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from pipeline.scoring.judge_http import BadAnswerError, http_request

DEFAULT_MAX_TOKENS = 2048  # FastChat's for GPT-4 judges
REQUEST_REFUSED = (400, 413, 422)  # this request is malformed or too long: its judgment alone is lost
RETRIED = (408, 409, 429)  # and every 5xx


class JudgeError(RuntimeError):
    """The judge could not give a judgment."""


class JudgeUnavailableError(JudgeError):
    """The endpoint cannot be reached, keeps failing or refuses every request: the run is judged again later."""


class JudgmentFailedError(JudgeError):
    """This one request was refused or answered with something that is not a judgment: only it is lost."""


class Judge(Protocol):
    @property
    def name(self) -> str: ...  # read-only: a dataclass field or a property

    def complete(self, system: str, user: str) -> str: ...

    def info(self) -> dict[str, Any]: ...


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
        from pipeline.decoding.cpu_kernels import resolve_dtype  # noqa: PLC0415 - as above

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
        # the judge generates through transformers, never the engine's kernels: `auto` is bf16 only where it is native
        dtype = resolve_dtype(dtype, models.resolve_device(device), kernels=False)
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
    valid: tuple[str, ...]
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
                f"judge.kind=openai needs {missing}: set judge.base_url=http://host:port/v1 "
                "judge.model=<served model name>"
            )
        OpenAIJudge(**cfg)  # its settings checked (numbers finite and in range, the URL's scheme); nothing is sent
    return kind, cfg


def make_judge(cfg: Mapping[str, Any]) -> Judge:
    """A judge from its config: ``{kind: openai, base_url, model, api_key_env, max_new_tokens}`` or
    ``{kind: transformers, model, max_new_tokens}``."""
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
    """GET ``{base_url}/models`` once within ``timeout_s`` in all: the served model ids, or a ValueError naming
    the fix."""
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
