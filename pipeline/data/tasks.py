"""Task specs: what a dataset is, in one YAML (after lm-evaluation-harness's task files).

A dataset's config ``conf/dataset/<name>.yaml`` holds its measured slice (``path``, ``start``, ``limit``,
``max_new_tokens``...) and, under ``task:``, its spec:

    task:
      version: 1                     # bump when a change here changes what a cell measures (cell keys)
      loader: pipeline.data.humaneval  # module: load(path, **options) -> [Sample]
      prompt: pipeline.data.humaneval  # module: continuation(sample, turn, answers)[, chat_user_texts(sample)]
      stop_strings: ["\\ndef ", ...]  # where a base model's continuation ends (chat pairs: EOS)
      scorer:                        # null: measured for speed only
        name: humaneval              # pipeline.scoring.registry name, or "module:attribute"
        params: {}                   # keyword arguments of the scorer
        fields: [passed, result]     # per-sample verdicts copied onto each samples.jsonl record

A dataset config without ``task:`` (a second slice of a dataset) takes the task of the dataset it names.
The sweep, the cell and the driver read a task only through this spec: adding a dataset is one YAML
(plus, if new, one loader module and one scorer module), see docs/extending.md.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

import yaml

from pipeline.data.base import Prompt, Sample, format_prompt

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
TASK_KEYS = ("version", "loader", "prompt", "stop_strings", "scorer")
SCORER_KEYS = ("name", "params", "fields")


class TaskSpecError(ValueError):
    """A task spec that cannot be used; the message names the file's key and the fix."""


def _module(path: str, what: str, name: str) -> ModuleType:
    if not isinstance(path, str) or not path or path.startswith("."):  # import_module: a TypeError on ".x"
        raise TaskSpecError(
            f"task {name!r}: {what} module {path!r} is not an absolute module name; name a module on the "
            f"Python path (e.g. pipeline.data.{name}; relative names such as .{name} cannot be imported)"
        )
    try:
        return importlib.import_module(path)
    except ImportError as err:
        raise TaskSpecError(
            f"task {name!r}: {what} module {path!r} cannot be imported ({err}); "
            f"name a module on the Python path (e.g. pipeline.data.{name})"
        ) from None


@dataclass(frozen=True)
class TaskSpec:
    """One dataset's task: loader, prompt format, stop strings, scorer with its parameters and fields, version."""

    name: str
    loader: str
    prompt: str
    stop_strings: tuple[str, ...] = ()
    scorer: str | None = None
    scorer_params: dict[str, Any] = field(default_factory=dict)
    score_fields: tuple[str, ...] = ()
    version: int = 1

    @classmethod
    def from_config(cls, name: str, task: Mapping[str, Any]) -> TaskSpec:
        """The spec of dataset ``name`` from its ``task:`` mapping, checked (unknown keys, types, importable
        modules)."""
        if not isinstance(task, Mapping):
            raise TaskSpecError(f"task {name!r}: `task:` must be a mapping with keys {list(TASK_KEYS)}, got {task!r}")
        unknown = sorted(set(task) - set(TASK_KEYS))
        if unknown:
            raise TaskSpecError(f"task {name!r}: unknown key(s) {unknown} under `task:`; valid keys: {list(TASK_KEYS)}")
        if not task.get("loader"):
            raise TaskSpecError(f"task {name!r}: `task.loader` is missing (the module with load(path, **options))")
        scorer = task.get("scorer") or {}
        if not isinstance(scorer, Mapping) or (scorer and not scorer.get("name")):
            raise TaskSpecError(
                f"task {name!r}: `task.scorer` must be null or a mapping with `name` (and `params`, `fields`)"
            )
        unknown = sorted(set(scorer) - set(SCORER_KEYS))
        if unknown:
            raise TaskSpecError(
                f"task {name!r}: unknown key(s) {unknown} under `task.scorer`; valid keys: {list(SCORER_KEYS)}"
            )
        version = task.get("version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise TaskSpecError(f"task {name!r}: `task.version` must be an integer >= 1, got {version!r}")
        stops = task.get("stop_strings") or ()
        if isinstance(stops, str) or not all(isinstance(s, str) and s for s in stops):
            raise TaskSpecError(
                f"task {name!r}: `task.stop_strings` must be a list of non-empty strings, got {stops!r}"
            )
        spec = cls(
            name=str(name),
            loader=str(task["loader"]),
            prompt=str(task.get("prompt") or task["loader"]),
            stop_strings=tuple(stops),
            scorer=scorer.get("name"),
            scorer_params=dict(scorer.get("params") or {}),
            score_fields=tuple(scorer.get("fields") or ()),
            version=version,
        )
        if not callable(getattr(spec.loader_module(), "load", None)):
            raise TaskSpecError(f"task {name!r}: loader module {spec.loader!r} has no load(path, **options)")
        if not callable(getattr(spec.prompt_module(), "continuation", None)):
            raise TaskSpecError(
                f"task {name!r}: prompt module {spec.prompt!r} has no continuation(sample, turn, answers)"
            )
        return spec

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskSpec:
        """Back from :meth:`to_dict` (a cell carries its task as a plain mapping across Ray)."""
        return cls(
            **{
                **data,
                "stop_strings": tuple(data.get("stop_strings") or ()),
                "score_fields": tuple(data.get("score_fields") or ()),
                "scorer_params": dict(data.get("scorer_params") or {}),
            }
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "loader": self.loader,
            "prompt": self.prompt,
            "stop_strings": list(self.stop_strings),
            "scorer": self.scorer,
            "scorer_params": dict(self.scorer_params),
            "score_fields": list(self.score_fields),
            "version": self.version,
        }

    def loader_module(self) -> ModuleType:
        return _module(self.loader, "loader", self.name)

    def prompt_module(self) -> ModuleType:
        return _module(self.prompt, "prompt", self.name)

    def load(self, path: str | Path | None = None, split: str | None = None, **options: Any) -> list[Sample]:
        """Every sample of the dataset (``options``: the loader's own keyword arguments)."""
        kwargs = dict(options)
        if split is not None:
            kwargs["split"] = split
        return self.loader_module().load(path, **kwargs)

    def format(
        self, sample: Sample, tokenizer: Any, *, chat: bool, turn: int = 0, answers: Sequence[str] = ()
    ) -> Prompt:
        """The prompt for ``turn`` of ``sample``: the chat template (chat pairs) or the task's continuation."""
        module = self.prompt_module()
        user_texts = module.chat_user_texts(sample) if chat and hasattr(module, "chat_user_texts") else None
        return format_prompt(
            sample,
            tokenizer,
            chat=chat,
            turn=turn,
            answers=answers,
            continuation=module.continuation,
            chat_user_texts=user_texts,
        )

    def stops(self, chat: bool) -> tuple[str, ...]:
        """Stop strings for counting tokens of continuation prompts (none for chat: EOS ends a turn)."""
        return () if chat else self.stop_strings


def task_names(conf_dir: str | Path | None = None) -> list[str]:
    """The datasets of ``conf/dataset/`` that define a task (their file names)."""
    folder = Path(conf_dir or CONF_DIR) / "dataset"
    return sorted(
        p.stem for p in folder.glob("*.yaml") if isinstance((yaml.safe_load(p.read_text()) or {}).get("task"), Mapping)
    )


def task_spec(name: str, conf_dir: str | Path | None = None) -> TaskSpec:
    """The task of dataset ``name`` (``conf/dataset/<name>.yaml``'s ``task:``), outside a sweep (scorer CLIs, tests)."""
    path = Path(conf_dir or CONF_DIR) / "dataset" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    if not isinstance(data, Mapping) or "task" not in data:
        raise TaskSpecError(
            f"unknown dataset {name!r}: no task in {path}; datasets with a task: {task_names(conf_dir)}"
        )
    return TaskSpec.from_config(str(data.get("name") or name), data["task"])
