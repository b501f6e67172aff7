"""The training loop around the engine: progress, metrics, checkpoints, resume, evaluation.

`fit` trains one configuration on a `Task` for one or N seeds. With a `workdir` it appends
every step's metrics and every evaluation to `metrics.jsonl`, saves an orbax checkpoint
every `checkpoint_every` steps, at the end and on Ctrl-C, and resumes from the latest intact
one: batches depend only on (seed, step) and the whole state is checkpointed, so a resumed
run ends bit for bit where an uninterrupted one would. The curves survive a resume too (read
back from the metrics file).

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
import time
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm as plain_tqdm
from tqdm.auto import tqdm

from attention_jax.config import TrainConfig
from attention_jax.errors import STOP, ConfigError, Preempted, TrainingDiverged, note
from attention_jax.train.checkpoints import Checkpoints, fingerprint
from attention_jax.train.distributed import is_writer, to_host
from attention_jax.train.engine import Engine
from attention_jax.train.tasks import Task

STEP_METRICS = ("loss", "lr", "grad_norm", "block_grad_norm")
ACCELERATOR_STEPS_PER_CALL = 16


def default_steps_per_call(backend: str | None = None) -> int:
    """1 on a CPU (a step is milliseconds of compute), 16 on a GPU/TPU (a step is less than its launch)."""
    import jax
    return 1 if (backend or jax.default_backend()) == "cpu" else ACCELERATOR_STEPS_PER_CALL


def choose_steps_per_call(train_config: TrainConfig, *, asked: int | None = None, checkpoints: bool = True) -> int:
    """Steps per compiled call: at most `asked` (else `default_steps_per_call()`), and a divisor
    of the run's length and of its evaluation and checkpoint intervals, so those fall between
    calls and every call has one shape."""
    if asked is None:
        asked = default_steps_per_call()
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
        raise ConfigError(f"steps_per_call={asked!r} must be a positive whole number (1 = one step per call)")
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
    history: list[dict] = dataclasses.field(default_factory=list)   # {step, figure: [per seed]} per evaluation
    train_log: list[dict] = dataclasses.field(default_factory=list)  # {step, metric: [per seed]} per step
    steps_per_call: int = 1

    def mean_std(self, figure: str) -> tuple[float, float]:
        return mean_std(self.final[figure])


def mean_std(values) -> tuple[float, float]:
    """Mean and sample standard deviation over seeds (0 for a single seed), in float64."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1) if len(values) > 1 else 0.0)


def fit(engine: Engine, task: Task, *, seeds: Sequence[int] = (0,), workdir: str | pathlib.Path | None = None,
        resume: bool = True, progress: bool = True, desc: str = "train", steps_per_call: int | None = None) -> RunResult:
    seeds, tc = [int(s) for s in seeds], engine.train_config
    per_call = choose_steps_per_call(tc, asked=steps_per_call, checkpoints=workdir is not None)
    if len(seeds) != engine.n_seeds:
        raise ConfigError(f"{len(seeds)} seed(s) for an engine built for {engine.n_seeds}; "
                          f"build it with Engine(..., n_seeds={len(seeds)})")
    workdir = pathlib.Path(workdir) if workdir is not None else None
    ckpt = None
    if workdir is not None:
        ckpt = Checkpoints(workdir, tc.checkpoint_every, fingerprint(engine.model_config, tc, seeds, task.identity),
                           resume=resume)
    start, state = ckpt.restore(engine.abstract_state(seeds)) if ckpt else (0, None)
    metrics_file = workdir / "metrics.jsonl" if workdir is not None else None
    if start and not ckpt.metrics_intact(metrics_file):      # the curves before it could not be rebuilt
        note(f"{metrics_file} changed since step {start} was saved; training this run again from the start")
        ckpt.discard()
        start, state = 0, None
    if metrics_file is not None and start == 0 and is_writer():
        metrics_file.unlink(missing_ok=True)      # a fresh start: the old run's lines are not ours

    def log(record):   # append-only JSON lines; opened per record so no handle outlives fit
        if metrics_file is not None and is_writer():
            with metrics_file.open("a") as f:
                f.write(json.dumps(record) + "\n")

    def evaluate(step):
        point = {"step": step, **{k: np.atleast_1d(v).tolist() for k, v in task.evaluate(engine, state).items()}}
        bad = [k for k, v in point.items() if k != "step" and not np.all(np.isfinite(v))]
        if bad:
            raise TrainingDiverged(desc, step, f"{bad[0]} is {point[bad[0]]}", tc.lr)
        history[:] = [h for h in history if h["step"] != step] + [point]
        return point

    pending = []      # (first step, steps, metrics) still on the device: fetched together, so no step waits

    def flush():
        for (first, n), m in zip([p[:2] for p in pending], to_host([p[2] for p in pending])):
            for j in range(n):   # a call of n > 1 steps stacked its metrics [n, ...]
                step, mj = first + j, {key: v[j] for key, v in m.items()} if n > 1 else m
                record = {"step": step, **{key: np.asarray(v).tolist() for key, v in mj.items()}}
                if not np.all(np.isfinite(mj["loss"])):
                    raise TrainingDiverged(desc, step, f"the loss is {record['loss']}", tc.lr,
                                           kept=ckpt.latest_step() if ckpt else None)
                train_log.append(record)
                log(record)
        pending.clear()

    state = engine.init(seeds) if state is None else engine.replicate(state)
    history, train_log = read_metrics(metrics_file, start)
    due = lambda step: tc.eval_every and step % tc.eval_every == 0 and 0 < step < tc.steps
    if due(start) and start not in {h["step"] for h in history}:
        log(evaluate(start))     # interrupted between the step and its evaluation
    done, t0 = start, time.perf_counter()
    shown = progress and is_writer()   # tqdm.auto's notebook bar warns without ipywidgets even when off
    bar = (tqdm if shown else plain_tqdm)(total=tc.steps, initial=start, desc=desc, disable=not shown, dynamic_ncols=True,
                                          leave=False)
    try:
        while done < tc.steps:
            if STOP.is_set():
                raise KeyboardInterrupt
            step = done
            # A whole call where it fits; single steps only to realign a run resumed off the grid.
            n = per_call if per_call > 1 and step % per_call == 0 and step + per_call <= tc.steps else 1
            if n == 1:
                state, metrics = engine.step(state, engine.shard([task.sample(s, step) for s in seeds]))
            else:
                state, metrics = engine.steps(state, engine.shard_steps(
                    [[task.sample(s, i) for s in seeds] for i in range(step, step + n)]))
            done = step + n
            pending.append((step + 1, n, metrics))
            saving = ckpt is not None and ckpt.due(done, since=step + 1)
            if done // tc.log_every > step // tc.log_every or done == tc.steps or saving or due(done):
                flush()        # every saved or evaluated state has a finite loss behind it
                bar.set_postfix(loss=f"{np.mean(train_log[-1]['loss']):.3f}")
            if due(done):
                log(evaluate(done))
            if saving:
                ckpt.save(done, state, metrics_file)
                if ckpt.preempted:     # the machines are going: stop here, all processes at this step
                    raise Preempted(done)
            bar.update(n)
    except KeyboardInterrupt:
        if ckpt and done > start:
            try:
                flush()
            except Exception:
                pass
            else:
                ckpt.keep(done, state, metrics_file)   # keep what this run has finished
        raise
    finally:
        bar.close()
    if STOP.is_set():
        raise KeyboardInterrupt
    seconds = time.perf_counter() - t0
    if ckpt:            # the finished state first (its loss is finite): an interrupted evaluation redoes only itself
        if ckpt.latest_step() != tc.steps:
            ckpt.save(tc.steps, state, metrics_file)
        ckpt.close()
    final = evaluate(tc.steps)
    log({**final, "seconds": seconds})
    return RunResult(seeds, {key: v for key, v in final.items() if key != "step"}, tc.steps, seconds, start, state,
                     history, train_log, per_call)


def read_metrics(metrics_file: pathlib.Path | None, step: int) -> tuple[list[dict], list[dict]]:
    """(evaluations, step metrics) a killed run logged up to its checkpoint `step`; the last line per step wins.

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
        if all(k in r for k in STEP_METRICS):
            steps[at] = {k: r[k] for k in ("step", *STEP_METRICS)}
        elif "seconds" not in r:
            evals[at] = r
    return [evals[k] for k in sorted(evals)], [steps[k] for k in sorted(steps)]
