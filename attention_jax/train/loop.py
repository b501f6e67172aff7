"""The training loop around the engine: progress, metrics, checkpoints, resume, evaluation.

`fit` trains one configuration for one or N seeds and returns train and held-out
perplexity per seed. With a `workdir` it appends metrics as JSON lines, saves an orbax
checkpoint every `checkpoint_every` steps, at the end and on Ctrl-C, and resumes from the
latest one: the data order depends only on (seed, step) and the optimizer state, step
count and RNG state are all inside the checkpointed pytree, so a resumed run ends with
the same parameters as an uninterrupted one, bit for bit on CPU. With `eval_every` it
also measures train and held-out perplexity along the way (`RunResult.history`), which
survives a resume: the points before it are read back from the metrics file.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Any, Sequence

import numpy as np
from tqdm.auto import tqdm

from attention_jax.config import ModelConfig
from attention_jax.train.checkpoints import Checkpoints
from attention_jax.train.engine import Engine, TrainConfig


@dataclasses.dataclass
class RunResult:
    seeds: list[int]
    train_ppl: list[float]
    val_ppl: list[float]
    steps: int
    seconds: float
    resumed_from: int
    state: Any = dataclasses.field(repr=False, default=None)
    history: list[dict] = dataclasses.field(default_factory=list)  # {step, train_ppl, val_ppl} per eval

    def mean_std(self, field: str) -> tuple[float, float]:
        values = np.asarray(getattr(self, field), dtype=np.float64)
        return float(values.mean()), float(values.std(ddof=1) if len(values) > 1 else 0.0)


def fit(model_config: ModelConfig, train_config: TrainConfig, train_tokens: np.ndarray,
        val_tokens: np.ndarray, *, seeds: Sequence[int] = (0,), workdir: str | pathlib.Path | None = None,
        resume: bool = True, progress: bool = True, desc: str = "train",
        engine: Engine | None = None) -> RunResult:
    seeds = [int(s) for s in seeds]
    tc = train_config
    engine = engine or Engine(model_config, tc, n_seeds=len(seeds))
    workdir = pathlib.Path(workdir) if workdir is not None else None
    ckpt = None
    if workdir is not None:
        fingerprint = {"model": model_config.to_dict(), "train": dataclasses.asdict(tc), "seeds": seeds}
        ckpt = Checkpoints(workdir, tc.checkpoint_every, fingerprint, resume=resume)
    start, state = ckpt.restore(engine.abstract_state(seeds)) if ckpt else (0, None)

    metrics = workdir / "metrics.jsonl" if workdir is not None else None
    if metrics is not None and not resume:
        metrics.unlink(missing_ok=True)

    def log(record):   # append-only JSON lines; opened per record so no handle outlives fit
        if metrics is not None:
            with metrics.open("a") as f:
                f.write(json.dumps(record) + "\n")

    def evaluate(step):
        point = {"step": step,
                 "train_ppl": engine.perplexity(state, train_tokens, max_windows=tc.train_eval_windows).tolist(),
                 "val_ppl": engine.perplexity(state, val_tokens).tolist()}
        history[:] = [h for h in history if h["step"] != step] + [point]
        return point

    state = engine.init(seeds) if state is None else engine.replicate(state)
    history = _history_until(metrics, min(start, tc.steps - 1))
    due = lambda step: tc.eval_every and step % tc.eval_every == 0 and 0 < step < tc.steps
    if due(start) and start not in {h["step"] for h in history}:
        log(evaluate(start))     # interrupted between the step and its evaluation
    done, t0 = start, time.perf_counter()
    bar = tqdm(total=tc.steps, initial=start, desc=desc, disable=not progress, dynamic_ncols=True, leave=False)
    try:
        for step in range(start, tc.steps):
            x, y = engine.batch(train_tokens, seeds, step)
            state, loss = engine.step(state, x, y)
            done = step + 1
            if done % tc.log_every == 0 or done == tc.steps:
                losses = np.atleast_1d(np.asarray(loss)).tolist()
                bar.set_postfix(loss=f"{np.mean(losses):.3f}")
                log({"step": done, "loss": losses})
            if due(done):
                log(evaluate(done))
            if ckpt:
                ckpt.save(done, state)
            bar.update(1)
    except KeyboardInterrupt:
        if ckpt and done > start:
            try:
                ckpt.save(done, state, force=True)   # keep what this run has finished
            except Exception:
                pass                                 # the interrupted step may hold donated buffers
        raise
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    if ckpt:
        if ckpt.manager.latest_step() != tc.steps:
            ckpt.save(tc.steps, state, force=True)
        ckpt.close()
    final = evaluate(tc.steps)
    log({**final, "seconds": seconds})
    return RunResult(seeds, final["train_ppl"], final["val_ppl"], tc.steps, seconds, start, state, history)


def _history_until(metrics: pathlib.Path | None, step: int) -> list[dict]:
    """Evaluations a killed run logged up to its checkpoint `step` (the last one per step wins)."""
    if metrics is None or step <= 0 or not metrics.exists():
        return []
    points = {}
    for line in metrics.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:   # a line cut short by the kill
            continue
        if "val_ppl" in r and "train_ppl" in r and r["step"] <= step:
            points[r["step"]] = {k: r[k] for k in ("step", "train_ppl", "val_ppl")}
    return [points[k] for k in sorted(points)]
