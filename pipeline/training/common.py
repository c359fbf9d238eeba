"""What every training tool does around its own loop: run setup, the log, the frozen target, the schedule.

``start_run`` sets the torch threads and the seed, makes the work folder and opens the run's log (a
file in the work folder, echoed on stdout); ``load_frozen_target`` loads a pair's target in float32
on the CPU with its parameters frozen, and its tokenizer; ``warmup_cosine`` is the learning rate of
the heads' training loops (linear warm-up, cosine decay to zero), ``scheduled_steps`` their schedule with its early
stops and ``train_head`` the loop around it. Relative paths of a training config (``work_dir``, ``out_dir``) are read
from the repository root (``repo_path``), whatever the current directory.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from pipeline.models import REPO_ROOT, PairSpec, load_model, load_tokenizer
from pipeline.training.cards import now


def repo_path(path: str | Path) -> Path:
    """``path`` as is when absolute, else from the repository root."""
    path = Path(path)
    return path if path.is_absolute() else REPO_ROOT / path


@dataclass
class TrainingRun:
    """A started run: its work folder, its start time, and ``log(msg)`` (file + stdout)."""

    work: Path
    log_file: Path
    echo: Callable[[str], bool] = field(default=lambda msg: True, repr=False)
    t0: float = field(default_factory=time.time)

    def log(self, msg: str) -> None:
        """``[wall clock +elapsed] msg`` appended to the log file; on stdout too where ``echo(msg)``."""
        line = f"[{now()} {time.time() - self.t0:+8.1f}s] {msg}"
        with open(self.log_file, "a") as f:
            f.write(line + "\n")
        if self.echo(msg):
            print(line, flush=True)

    def minutes(self) -> float:
        return round((time.time() - self.t0) / 60, 1)


def start_run(
    *,
    threads: int,
    seed: int | None,
    work_dir: str | Path,
    log_name: str = "train.log",
    echo: Callable[[str], bool] = lambda msg: True,
) -> TrainingRun:
    """Torch threads, the global seed (when given), the work folder and the log of a training run."""
    torch.set_num_threads(int(threads))
    if seed is not None:
        torch.manual_seed(seed)
    work = repo_path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    return TrainingRun(work=work, log_file=work / log_name, echo=echo)


def load_frozen_target(pair_cfg: Mapping[str, Any]) -> tuple[PairSpec, Any, Any]:
    """(pair spec, target in float32 on the CPU with ``requires_grad`` off, tokenizer) of a pair config."""
    spec = PairSpec.from_config(pair_cfg)
    model = load_model(spec.target, "float32", "cpu").requires_grad_(False)
    return spec, model, load_tokenizer(spec.target)


def warmup_cosine(lr: float, step: int, warmup: int, steps: int) -> float:
    """Learning rate at ``step`` (1-based): linear warm-up over ``warmup`` steps times a cosine decay to 0 at
    ``steps``."""
    return lr * min(1.0, step / max(warmup, 1)) * 0.5 * (1 + math.cos(math.pi * step / steps))


def scheduled_steps(
    opt: torch.optim.Optimizer,
    *,
    lr: float,
    warmup: int,
    steps: int,
    deadline: float | None = None,
    stop_after: int | None = None,
    log: Callable[[str], None] = print,
) -> Iterator[tuple[int, float]]:
    """(step, rate) for steps 1..``steps``, the ``warmup_cosine`` rate set on ``opt`` first.

    Stops early, saying so in the log, after ``stop_after`` steps (the schedule stays that of ``steps``:
    deterministic) or once the wall clock passes ``deadline`` (a safety net).
    """
    for step in range(1, steps + 1):
        if stop_after is not None and step > stop_after:
            log(f"stop_after_steps reached at step {step - 1} (the schedule stays that of {steps} steps)")
            return
        if deadline is not None and time.time() > deadline:
            log(f"time budget reached at step {step}")
            return
        rate = warmup_cosine(lr, step, warmup, steps)
        for group in opt.param_groups:
            group["lr"] = rate
        yield step, rate


def train_head(
    head: torch.nn.Module,
    params: Sequence[torch.Tensor],
    opt: torch.optim.Optimizer,
    step_loss: Callable[[], tuple[torch.Tensor, str]],
    *,
    lr: float,
    warmup: int,
    steps: int,
    clip: float,
    desc: str,
    deadline: float | None = None,
    stop_after: int | None = None,
    log: Callable[[str], None] = print,
    log_every: int = 10,
    eval_every: int = 0,
    evaluate: Callable[[int], Any] | None = None,
) -> int:
    """The heads' training loop: ``scheduled_steps`` of ``step_loss()`` (the batch's loss and a text of its
    parts for the log), gradient clipping at ``clip``, a log line every ``log_every`` steps, ``evaluate(step)``
    every ``eval_every``; ``head`` in eval mode after. Returns the number of steps run."""
    head.train()
    done = 0
    bar = tqdm(
        scheduled_steps(opt, lr=lr, warmup=warmup, steps=steps, deadline=deadline, stop_after=stop_after, log=log),
        total=steps,
        desc=desc,
        mininterval=5.0,
    )
    for step, rate in bar:
        loss, parts = step_loss()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        done = step
        if log_every and (step % log_every == 0 or step == 1):
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
            log(f"step {step}/{steps} loss {float(loss.detach()):.4f} {parts} lr {rate:.2e}")
        if eval_every and evaluate is not None and step % eval_every == 0:
            evaluate(step)
            head.train()
    head.eval()
    return done
