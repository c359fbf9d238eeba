"""MT-Bench single-answer grading with FastChat's judge prompts, by an HTTP or a local judge.

Follows ``fastchat/llm_judge`` (Zheng et al. 2023): turn 1 is judged with ``single-v1`` (or
``single-math-v1`` with the reference answer for math, reasoning and coding), turn 2 with the
``-multi-turn`` forms that show the whole conversation; the judge runs at temperature 0; the score is
parsed from ``[[rating]]`` with ``[rating]`` as fallback; an unparseable judgment is counted and
excluded from the means. Scores are reported per turn, per category and overall.

The judge is configured apart from the pair being measured:

- ``OpenAIJudge``: any OpenAI-compatible ``/chat/completions`` endpoint; the key is read from the
  environment variable the config names (never stored, printed or logged);
- ``TransformersJudge``: a local causal LM with a chat template, greedy decoding.

The judge's model name and the versions its endpoint reports are recorded with the scores.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol, Sequence

from pipeline.data import load_dataset
from pipeline.data.mt_bench import load_judge_prompts
from pipeline.scoring import print_json, read_predictions, run_cli

NEED_REF_CATS = ("math", "reasoning", "coding")  # FastChat's categories judged against a reference
ONE_SCORE = re.compile(r"\[\[(\d+\.?\d*)\]\]")
ONE_SCORE_BACKUP = re.compile(r"\[(\d+\.?\d*)\]")
DEFAULT_MAX_TOKENS = 2048  # FastChat's for GPT-4 judges


class Judge(Protocol):
    name: str

    def complete(self, system: str, user: str) -> str: ...

    def info(self) -> dict[str, Any]: ...


# --------------------------------------------------------------------------- parsing and prompts


def parse_rating(judgment: str) -> float | None:
    """The score of a judgment (``[[x]]``, else ``[x]``); None when there is none (FastChat's -1)."""
    match = ONE_SCORE.search(judgment) or ONE_SCORE_BACKUP.search(judgment)
    if not match:
        return None
    return float(ast.literal_eval(match.group(1)))


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


@dataclass
class OpenAIJudge:
    """A judge behind an OpenAI-compatible HTTP endpoint (``base_url`` up to ``/v1``)."""

    base_url: str
    model: str
    api_key_env: str | None = "OPENAI_API_KEY"
    temperature: float = 0.0
    max_tokens: int = DEFAULT_MAX_TOKENS
    timeout_s: float = 120.0
    max_retries: int = 5
    retry_sleep_s: float = 2.0
    versions: set[str] = field(default_factory=set, repr=False)

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
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                "temperature": self.temperature,
                "max_tokens": self.max_tokens,
                "n": 1,
            }
        ).encode()
        url = self.base_url.rstrip("/") + "/chat/completions"
        last_error = ""
        for attempt in range(self.max_retries + 1):
            request = urllib.request.Request(url, data=body, headers=self._headers(), method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    payload = json.loads(response.read())
                self.versions.add(str(payload.get("model", self.model)) + (
                    f" ({payload['system_fingerprint']})" if payload.get("system_fingerprint") else ""
                ))
                return payload["choices"][0]["message"]["content"] or ""
            except urllib.error.HTTPError as err:
                last_error = f"HTTP {err.code} {err.reason}"
                if err.code not in (408, 409, 429) and err.code < 500:
                    break  # a client error will not go away by retrying
            except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError, KeyError, IndexError) as err:
                last_error = f"{type(err).__name__}: {err}"
            if attempt < self.max_retries:
                time.sleep(self.retry_sleep_s * (2**attempt))
        raise RuntimeError(f"judge endpoint {url} failed after {self.max_retries + 1} attempt(s): {last_error}")

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
    def from_spec(cls, spec: str | Mapping[str, Any], *, dtype: str = "float32", device: str = "auto", max_new_tokens: int = 512) -> "TransformersJudge":
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
        return self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

    def info(self) -> dict[str, Any]:
        return {"kind": "transformers", "model": self.name, "max_new_tokens": self.max_new_tokens, "decoding": "greedy"}


OPENAI_KEYS = ("base_url", "model", "api_key_env", "temperature", "max_tokens", "timeout_s", "max_retries", "retry_sleep_s")
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
            raise ValueError(f"judge.kind=openai needs {missing}: set judge.base_url=http://host:port/v1 judge.model=<served model name>")
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


def check_endpoint(base_url: str, api_key_env: str | None = "OPENAI_API_KEY", model: str | None = None, timeout_s: float = 5.0) -> list[str]:
    """GET ``{base_url}/models`` once with a short timeout; the served model ids, or ValueError naming the fix."""
    url = base_url.rstrip("/") + "/models"
    headers = {}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    fix = ("start the OpenAI-compatible server, or set judge.base_url to where it listens (up to /v1), "
           "or judge.enabled=false / judge.kind=transformers")
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as response:
            payload = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        hint = f" (the key in ${api_key_env} is missing or wrong)" if err.code in (401, 403) else ""
        raise ValueError(f"judge endpoint {url} answered HTTP {err.code} {err.reason}{hint}: {fix}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, json.JSONDecodeError) as err:
        raise ValueError(f"judge endpoint {url} is not reachable ({type(err).__name__}: {getattr(err, 'reason', err)}): {fix}") from None
    served = [str(m.get("id")) for m in (payload.get("data") or []) if isinstance(m, Mapping)]
    if model and served and model not in served:
        raise ValueError(f"judge endpoint {url} does not serve model {model!r} (it serves {served}): set judge.model to one of them")
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
        judgment = judge.complete(system, user)
        return {
            "id": sid,
            "category": category,
            "turn": turn,
            "judge_prompt": name,
            "score": parse_rating(judgment),
            "judgment": judgment,
        }

    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            details = list(pool.map(run, jobs))
    else:
        details = [run(job) for job in jobs]
    return summarize(details, judge.info())


def summarize(details: list[dict[str, Any]], judge_info: Mapping[str, Any]) -> dict[str, Any]:
    """Means over parsed scores (unparseable judgments counted and excluded)."""
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
        "judge": dict(judge_info),
        "details": details,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="MT-Bench folder (question.jsonl, reference_answer/, judge_prompts.jsonl)")
    parser.add_argument("--predictions", required=True, help="JSONL of {id: question_id, prediction: [answer1, answer2]}")
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
