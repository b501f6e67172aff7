"""The training loop around the engine: progress, metrics, checkpoints, resume, evaluation.

`fit` trains one configuration on a `Task` for one or N seeds. With a `workdir` it appends
every step's metrics and every evaluation to `metrics.jsonl`, saves an orbax checkpoint
every `checkpoint_every` steps, at the end and on Ctrl-C, and resumes from the latest intact
one: batches depend only on (seed, step) and the whole state is checkpointed (float16's loss
scale included), so a resumed run ends bit for bit where an uninterrupted one would on a CPU (a
GPU's scatters and cuDNN's backward are not deterministic by default: to float rounding there,
docs/install.md). The curves survive a resume too (read back from the metrics file).

A loss that stops being finite ends the run with one line (`TrainingDiverged`) before that
state is saved. A preemption notice (JAX's distributed runtime) saves the step all processes
agree on and stops with `Preempted`. On a GPU/TPU the loop hands the device several steps
per call (`steps_per_call`, a divisor of the evaluation and checkpoint intervals, so those
still fall on their steps); on a CPU, one.
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import sys
import threading
import time
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm as plain_tqdm
from tqdm.auto import tqdm

from attention_jax.config import TrainConfig
from attention_jax.errors import ConfigError, Preempted, TrainingDiverged, note
from attention_jax.speed.backend import backend_of
from attention_jax.train.checkpoints import KEEP, Checkpoints, run_record
from attention_jax.train.objective import token_loss
from attention_jax.train.distributed import is_writer, to_host
from attention_jax.train.engine import Engine
from attention_jax.train.tasks import Task

# What a step reports: float16's step adds its loss scale and whether it was skipped.
STEP_METRICS = ("loss", "lr", "grad_norm", "block_grad_norm", "loss_scale", "skipped")
ACCELERATOR_STEPS_PER_CALL = 16


def loss_digest(loss) -> str | None:
    """None for the default loss (what every run record so far was made with), else its digest."""
    from attention_jax.fingerprint import digest
    return None if loss is token_loss else digest(loss)


def default_steps_per_call(backend=None) -> int:
    """1 on a CPU (a step is milliseconds of compute), 16 on a GPU/TPU (a step is less than its
    launch); `backend`: `speed.backend_of`'s (None: the default devices)."""
    return 1 if backend_of(backend).cpu else ACCELERATOR_STEPS_PER_CALL


def choose_steps_per_call(train_config: TrainConfig, *, asked: int | None = None,
                          checkpoints: bool = True, backend=None) -> int:
    """Steps per compiled call: at most `asked` (else `default_steps_per_call(backend)`), and a
    divisor of the run's length and of its evaluation and checkpoint intervals, so those fall
    between calls and every call has one shape."""
    if asked is None:
        asked = default_steps_per_call(backend)
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
        raise ConfigError(f"steps_per_call={asked!r} must be a positive whole number "
                          "(1 = one step per call)")
    tc = train_config
    every = math.gcd(tc.steps, tc.eval_every, tc.checkpoint_every if checkpoints else 0)
    return max(d for d in range(1, min(asked, every) + 1) if every % d == 0)


@dataclasses.dataclass
class RunResult:
    seeds: list[int]
    final: dict[str, list[float]]   # the task's figures at the end, one value per seed
    steps: int
    seconds: float
    resumed_from: int
    state: Any = dataclasses.field(repr=False, default=None)
    history: list[dict] = dataclasses.field(default_factory=list)   # {step, figure: [per seed]}
                                                                    # per evaluation
    train_log: list[dict] = dataclasses.field(default_factory=list)  # {step, metric: [per seed]}
                                                                     # per step
    steps_per_call: int = 1

    def mean_std(self, figure: str) -> tuple[float, float]:
        return mean_std(self.final[figure])


def mean_std(values) -> tuple[float, float]:
    """Mean and sample standard deviation over seeds (0 for a single seed), in float64."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1) if len(values) > 1 else 0.0)


def fit(engine: Engine, task: Task, *, seeds: Sequence[int] = (0,),
        workdir: str | pathlib.Path | None = None, resume: bool = True, progress: bool = True,
        desc: str = "train", steps_per_call: int | None = None,
        stop: threading.Event | None = None, keep_finished: int = KEEP) -> RunResult:
    """Train `engine`'s configuration on `task` for `seeds` (one per engine seed) up to its
    TrainConfig's steps, and score it: a `RunResult`. `workdir`: keep metrics and checkpoints there
    and resume from them (`resume=False`: start afresh); a finished run keeps its `keep_finished`
    latest checkpoints (1: the trained model alone). `stop`: an event the caller owns (a signal
    handler sets it, say): the loop then stops at its next step as on Ctrl-C, saving
    what it finished."""
    if isinstance(keep_finished, bool) or not isinstance(keep_finished, int) or keep_finished < 1:
        raise ConfigError(f"keep_finished={keep_finished!r} must be a whole number of "
                          "checkpoints, at least 1")
    per_call = choose_steps_per_call(engine.train_config, asked=steps_per_call,
                                     checkpoints=workdir is not None, backend=engine.backend)
    seeds = engine.check_seeds(seeds)
    run = _Run(engine, task, seeds, None if workdir is None else pathlib.Path(workdir), resume)
    run.keep = keep_finished
    if 0 < run.start < engine.train_config.steps and is_writer():   # said whether or not
                                                                    # a bar shows it
        print(f"{desc}: resuming at step {run.start:,} of {engine.train_config.steps:,} "
              "from its checkpoint", file=sys.stderr, flush=True)
    shown = progress and is_writer()   # tqdm.auto's notebook bar warns without ipywidgets
                                       # even when off
    bar = (tqdm if shown else plain_tqdm)(total=engine.train_config.steps, initial=run.start,
                                          desc=desc, disable=not shown, dynamic_ncols=True,
                                          leave=False)
    tc, ckpt, t0 = engine.train_config, run.ckpt, time.perf_counter()
    try:
        while run.done < tc.steps:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            step = run.done
            n = run.advance(per_call)  # one compiled call: 1 step, or per_call in a scan
            saving = ckpt is not None and ckpt.due(run.done, since=step + 1)
            if run.done // tc.log_every > step // tc.log_every or run.done == tc.steps or saving \
                    or run.due(run.done):
                run.flush()            # every saved or evaluated state has a finite loss behind it
                bar.set_postfix(loss=f"{np.mean(run.train_log[-1]['loss']):.3f}")
            if run.due(run.done):
                run.log(run.evaluate(run.done))
            if saving:
                ckpt.save(run.done, run.state, run.metrics_file)
                if ckpt.preempted:     # the machines are going: stop here,
                                       # all processes at this step
                    raise Preempted(run.done)
            bar.update(n)
    except KeyboardInterrupt:          # what this run finished is kept; the same call resumes it
        run.keep_finished()
        raise
    finally:
        bar.close()
    if stop is not None and stop.is_set():   # set during the last step: stopped all the same
        raise KeyboardInterrupt
    return run.finish(time.perf_counter() - t0, per_call)


class _Run:
    """One call of `fit`: the state, where it stands, its checkpoints and the metrics
    logged so far."""

    def __init__(self, engine, task, seeds, workdir, resume):
        self.engine, self.task, self.seeds, self.tc = engine, task, seeds, engine.train_config
        self.ckpt = None if workdir is None else Checkpoints(
            workdir, self.tc.checkpoint_every,
            run_record(engine.model_config, self.tc, seeds, task.identity,
                       loss_digest(engine.loss)),
            resume=resume)
        self.metrics_file = None if workdir is None else workdir / "metrics.jsonl"
        self.start, state = self.ckpt.restore(engine.abstract_state(seeds)) if self.ckpt \
            else (0, None)
        if self.start and not self.ckpt.metrics_intact(self.metrics_file):   # the curves could not
                                                                             # be rebuilt
            note(f"{self.metrics_file} changed since step {self.start} was saved; training this "
                 "run again from the start")
            self.ckpt.discard()
            self.start, state = 0, None
        if self.metrics_file is not None and self.start == 0 and is_writer():
            self.metrics_file.unlink(missing_ok=True)      # a fresh start: the old run's
                                                           # lines are not ours
        self.state = engine.init(seeds) if state is None else engine.replicate(state)
        self.history, self.train_log = read_metrics(self.metrics_file, self.start)
        self.pending = []   # (first step, steps, metrics) still on the device: fetched together,
                            # so no step waits
        self.done = self.start
        if self.due(self.start) and self.start not in {h["step"] for h in self.history}:
            self.log(self.evaluate(self.start))     # interrupted between the step
                                                    # and its evaluation

    def due(self, step: int) -> bool:
        """Whether an evaluation falls on `step` (the last step's is the final one)."""
        return bool(self.tc.eval_every and step % self.tc.eval_every == 0
                    and 0 < step < self.tc.steps)

    def log(self, record: dict) -> None:
        """Append a JSON line to metrics.jsonl, opened per record so no handle outlives fit."""
        if self.metrics_file is not None and is_writer():
            with self.metrics_file.open("a") as f:
                f.write(json.dumps(record) + "\n")

    def evaluate(self, step: int) -> dict:
        point = {"step": step, **{k: np.atleast_1d(v).tolist()
                                  for k, v in self.task.evaluate(self.engine, self.state).items()}}
        bad = [k for k, v in point.items() if k != "step" and not np.all(np.isfinite(v))]
        if bad:
            raise TrainingDiverged(step, f"{bad[0]} is {point[bad[0]]}", self.tc.lr)
        self.history[:] = [h for h in self.history if h["step"] != step] + [point]
        return point

    def flush(self) -> None:
        """Every pending step's metrics to the host, the log and the file; a non-finite loss
        ends the run."""
        for (first, n), m in zip([p[:2] for p in self.pending],
                                 to_host([p[2] for p in self.pending])):
            for j in range(n):   # a call of n > 1 steps stacked its metrics [n, ...]
                step, mj = first + j, {key: v[j] for key, v in m.items()} if n > 1 else m
                record = {"step": step, **{key: np.asarray(v).tolist() for key, v in mj.items()}}
                if not np.all(np.isfinite(mj["loss"])):
                    raise TrainingDiverged(step, f"the loss is {record['loss']}", self.tc.lr,
                                           kept=self.ckpt.latest_step() if self.ckpt else None)
                self.train_log.append(record)
                self.log(record)
        self.pending.clear()

    def advance(self, per_call: int) -> int:
        """One compiled call from `done`: a whole call of `per_call` steps where it fits (single
        steps only to realign a run resumed off the grid); the number of steps it took."""
        step, engine = self.done, self.engine
        n = per_call if (per_call > 1 and step % per_call == 0
                         and step + per_call <= self.tc.steps) else 1
        if n == 1:
            self.state, metrics = engine.step(
                self.state, engine.shard([self.task.sample(s, step) for s in self.seeds]))
        else:
            self.state, metrics = engine.steps(self.state, engine.shard_steps(
                [[self.task.sample(s, i) for s in self.seeds] for i in range(step, step + n)]))
        self.done = step + n
        self.pending.append((step + 1, n, metrics))
        return n

    def keep_finished(self) -> None:
        """On Ctrl-C: the steps this run finished, logged and saved, unless a loss among them is
        not finite (that state is not kept: the run resumes from the last checkpoint before it)."""
        if not self.ckpt or self.done <= self.start:
            return
        try:
            self.flush()
        except TrainingDiverged as e:
            note(f"step {self.done} is not saved: {e}")
            return
        self.ckpt.keep(self.done, self.state, self.metrics_file)

    def finish(self, seconds: float, per_call: int) -> RunResult:
        """The finished state saved first (its loss is finite: an interrupted evaluation redoes only
        itself), then the final evaluation."""
        if self.ckpt:
            if self.ckpt.latest_step() != self.tc.steps:
                self.ckpt.save(self.tc.steps, self.state, self.metrics_file)
            self.ckpt.finished(self.keep)
            self.ckpt.close()
        final = self.evaluate(self.tc.steps)
        self.log({**final, "seconds": seconds})
        return RunResult(self.seeds, {k: v for k, v in final.items() if k != "step"}, self.tc.steps,
                         seconds, self.start, self.state, self.history, self.train_log, per_call)


def read_metrics(metrics_file: pathlib.Path | None, step: int) -> tuple[list[dict], list[dict]]:
    """(evaluations, step metrics) a killed run logged up to its checkpoint `step`; the last
    line per step wins.

    Lines that a kill cut short, or that are damaged, are skipped: those steps are redone.
    """
    if metrics_file is None or step <= 0 or not metrics_file.exists():
        return [], []
    evals, steps = {}, {}
    for line in metrics_file.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            r = json.loads(line)
            at = r["step"]
        except (ValueError, TypeError, KeyError):
            continue
        if not isinstance(at, int) or not 0 < at <= step:
            continue
        if "loss" in r and set(r) <= {"step", *STEP_METRICS}:   # all of them, or the loss alone
                                                                # (step_metrics=False)
            steps[at] = r
        elif "seconds" not in r:
            evals[at] = r
    return [evals[k] for k in sorted(evals)], [steps[k] for k in sorted(steps)]
