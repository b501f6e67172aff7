"""The contestants of `experiments.throughput`, each run in a process of its own.

    python -m experiments.throughput.worker jax|torch --batch B [--warmup N] [--devices N]

Each contestant needs its own process: the allocator (LD_PRELOAD, or glibc's mallopt,
which must act before any thread exists) and the number of JAX CPU devices are fixed at
start. After warming up it prints one JSON line, then serves requests on stdin: a number n
runs and times n calls of the training step (one JSON list back, seconds per step: on a
GPU/TPU a call runs several steps, as `fit` does there); `peak [N [DTYPE]]` times a 2048×2048
matmul on the same backend, in the step's product dtype or DTYPE. `take_turns` is the parent's side: it alternates
between contestants, so whatever else loads the machine weighs on all of them alike.
"""
from __future__ import annotations

import os
import sys

# Imported before jax on purpose: mallopt must act before any thread exists. The package
# import runs no jax computation, so no thread pool has started yet.
from experiments.harness.platform import MALLOPT_ENV, apply_mallopt

MALLOPT_APPLIED = os.environ.get(MALLOPT_ENV) == "1" and __name__ == "__main__" and apply_mallopt()

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from experiments.throughput.constants import CONTEXT  # noqa: E402

VOCAB = 1024   # the ladder's "layer_norm" row; checked against its config below


def jax_contestant(batch: int, devices: int, loss_only: bool = False, attention: str = "auto",
                   dtype: str = "float32", context: int = CONTEXT, with_hlo: bool = False, with_eval: bool = False,
                   per_call: int | None = None):
    """(step(i), peak(), info): one call of the training step on batch i % 4, the backend's matmul
    rate, what ran.

    per_call: steps per call, as `fit` runs them (default: its own, 1 on a CPU, 16 on a GPU/TPU,
    where one step takes the device less time than Python takes to launch it); a call of K
    steps scans over the four batches in turn; info["steps_per_call"] says how many.
    with_hlo: info["hlo"] is the compiled one-step program's HLO text (experiments/throughput/profile.py).
    with_eval: info["perplexity"](tokens) evaluates the current state (tools/eval_cost.py).
    """
    import dataclasses

    import jax
    if devices:
        jax.config.update("jax_num_cpu_devices", devices)   # before the backend starts
    from attention_jax.data import get_batch
    from attention_jax.train import Engine, TrainConfig
    from attention_jax.train.loop import default_steps_per_call
    from experiments.harness.experiment import steps_per_call_from_env
    from experiments.configs import ONE_BLOCK
    assert ONE_BLOCK.vocab_size == VOCAB
    model_dtype, speed = dtypes(dtype, attention)
    cfg = dataclasses.replace(ONE_BLOCK, context=context, dtype=model_dtype)
    # AdamW, lr 1e-3: the ladder's step, with its metrics (loss, lr, gradient norms) or the loss only
    engine = Engine(cfg, TrainConfig(batch_size=batch), step_metrics=not loss_only, speed=speed)
    state = engine.init([0])
    tokens = np.random.default_rng(0).integers(0, VOCAB, max(200_000, 4 * batch * (context + 1))).astype(np.int32)
    host = [dict(zip(("x", "y"), get_batch(tokens, seed=0, step=s, batch_size=batch, context=context)))
            for s in range(4)]
    batches = [engine.shard([b]) for b in host]
    per_call = per_call or steps_per_call_from_env() or default_steps_per_call()
    scanned = engine.shard_steps([[host[j % 4]] for j in range(per_call)]) if per_call > 1 else None

    def step(i):
        nonlocal state
        if scanned is None:
            state, metrics = engine.step(state, batches[i % 4])
        else:
            state, metrics = engine.steps(state, scanned)
        jax.block_until_ready(metrics)

    info = described(engine, state, batches[0], speed, cfg, dtype, per_call, with_hlo)
    if with_eval:
        info["perplexity"] = lambda tokens: engine.perplexity(state, tokens)
    peak = functools.partial(matmul_peak, speed.matmul_dtype or cfg.dtype)
    return step, peak, info


def matmul_peak(step_dtype, n: int = 0, in_dtype: str = ""):
    """The backend's own matmul rate: n² (default 2048² on a CPU, 8192² on an accelerator), in
    `in_dtype` (default: the one the step's products use). Low precision accumulates in
    float32, as the model's dense layers do (`functional.dense`)."""
    import jax
    import jax.numpy as jnp
    from attention_jax import functional as F
    n = n or (2048 if jax.default_backend() == "cpu" else 8192)
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)   # not ones: a GPU multiplies constants faster
    a = a.astype(in_dtype or step_dtype)
    f = jax.jit(lambda x: F.dense(x, x))
    f(a).block_until_ready()
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        f(a).block_until_ready()
        ts.append(time.perf_counter() - t)
    return 2 * n**3 / float(np.median(ts))


def described(engine, state, batch, speed, cfg, dtype: str, per_call: int, with_hlo: bool) -> dict:
    """What ran: backend, devices, the attention form and kernel, dtype, window, steps per call (and the
    compiled step's HLO when asked, or when it must say whether cuDNN took the fused attention)."""
    import jax
    from attention_jax.speed import forms
    info = {"backend": jax.default_backend(), "devices": jax.device_count(), "attention": speed.form_for(cfg),
            "attention_kernel": speed.describe(cfg), "dtype": dtype, "context": cfg.context, "steps_per_call": per_call}
    cudnn = info["attention"] == "fused" and forms.fused_kernel(dtype, cfg.d_head_used) == "cudnn"
    if with_hlo or cudnn:
        info["hlo"] = engine._step.lower(state, batch).compile().as_text()
        if cudnn and "__cudnn$fmha" not in info["hlo"]:
            info["attention_kernel"] = "fused (XLA: cuDNN refused it)"   # the label was a prediction: the program says
        if not with_hlo:
            del info["hlo"]
    return info


def dtypes(dtype: str, attention: str = "auto"):
    """A contestant's dtype and attention as the model's compute dtype and the speed swap it trains with:
    "bfloat16_matmul" is a float32 model with bfloat16 products."""
    from attention_jax.speed import Speed
    if dtype == "bfloat16_matmul":
        return "float32", Speed(form=attention, matmul_dtype="bfloat16")
    return dtype, Speed(form=attention)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["jax", "torch"])
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--devices", type=int, default=0, help="JAX CPU devices (0: JAX's default)")
    p.add_argument("--loss-only", action="store_true", help="a step that returns the loss alone")
    p.add_argument("--attention", default="auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--context", type=int, default=CONTEXT)
    args = p.parse_args(argv)
    if args.kind == "jax":
        step, peak, info = jax_contestant(args.batch, args.devices, args.loss_only, args.attention, args.dtype,
                                          args.context)
    else:
        from experiments.torch_ref import torch_contestant
        from experiments.configs import ONE_BLOCK
        step, peak, info = torch_contestant(args.batch, ONE_BLOCK, args.dtype)
    for i in range(args.warmup):   # compiles, fills the allocator's caches
        step(i)
    info["mallopt"] = bool(MALLOPT_APPLIED)
    print(json.dumps(info), flush=True)
    done = args.warmup
    for line in sys.stdin:
        if line.split()[:1] == ["peak"]:     # "peak", "peak N" or "peak N DTYPE": the matmul rate at N x N
            words = line.split()[1:]
            print(json.dumps({"peak_flops": peak(int(words[0]) if words else 0, words[1] if words[1:] else "")
                              if peak else None}), flush=True)
            continue
        times, per_call = [], info.get("steps_per_call", 1)
        for _ in range(int(line)):
            t = time.perf_counter()
            step(done)
            times.append((time.perf_counter() - t) / per_call)    # seconds per training step
            done += 1
        print(json.dumps(times), flush=True)


def take_turns(rows: dict, p: dict, env=None) -> dict[str, dict]:
    """Parent side: start every contestant at once, then let them take turns; seconds per step.

    rows: name -> (worker arguments, extra environment, ...); p: batch, warmup, rounds, steps.
    """
    procs, errors = {}, {}
    for name, (args, extra, *_) in rows.items():
        cmd = [sys.executable, "-m", "experiments.throughput.worker", *args, "--batch", str(p["batch"]),
               "--warmup", str(p["warmup"])]
        errors[name] = tempfile.TemporaryFile(mode="w+")     # a failing contestant's reason, not its traceback
        procs[name] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors[name],
                                       text=True, env={**(os.environ if env is None else env), **extra})

    def reason(name) -> str:
        errors[name].seek(0)
        lines = [line.strip() for line in errors[name].read().splitlines() if line.strip()]
        return lines[-1][:200] if lines else "no output"

    def ask(name, line):
        procs[name].stdin.write(line + "\n")
        procs[name].stdin.flush()
        return json.loads(procs[name].stdout.readline())

    try:
        info = {name: json.loads(proc.stdout.readline() or "null") for name, proc in procs.items()}
        for name in [n for n, i in info.items() if i is None]:   # e.g. out of memory at a long context
            procs.pop(name).wait(timeout=60)
            info[name] = {"failed": True, "reason": reason(name)}
        for name in procs:
            if name.startswith("ours"):
                info[name].update(ask(name, f"peak {p.get('peak_size', 0)}"))
        if "ours" in procs:   # what MFU is measured against whatever the step's dtype: float32's rate
            info["ours"]["peak_flops_float32"] = ask("ours", f"peak {p.get('peak_size', 0)} float32")["peak_flops"]
        times = {name: [] for name in procs}
        for _ in range(p["rounds"]):
            for name in procs:
                times[name] += ask(name, str(p["steps"]))
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait(timeout=60)
        for f in errors.values():
            f.close()
    return {name: {**i, "times": times.get(name, [])} for name, i in info.items()}


if __name__ == "__main__":
    main()
