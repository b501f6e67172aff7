"""What the training loop costs the host per step, with the device's work taken away.

    python tools/host_cost.py [--steps 3000] [--seeds 1,3] [--per-call 1,16] [--repeats 3]

Runs `fit` on the paper ladder's one-block row and budget (batch 64, context 128, an
evaluation and a checkpoint every 500 steps) with the engine's compiled step replaced by
one that does no work, so what is left is Python's share: sampling the batches, checking
and placing them, launching the program, fetching and logging the metrics, the progress
bar and the checkpoints. On a GPU/TPU a step of the ladder's small models takes less
device time than this, so it sets the pace; docs/performance.md ("What the host spends a step")
quotes it for one step per call (a CPU's default) and for several (a GPU/TPU's).
Medians of `--repeats` runs after one run that compiles.
"""
from experiments.harness.platform import apply_mallopt

apply_mallopt()   # before JAX starts threads, as every command does

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def host_ms_per_step(steps: int, seeds: int, per_call: int, repeats: int) -> tuple[float, int]:
    import jax
    import jax.numpy as jnp
    from attention_jax.train import Engine, fit, text_task
    from experiments.configs import LADDER_BUDGETS, ONE_BLOCK
    tc = dataclasses.replace(LADDER_BUDGETS["paper"], steps=steps)
    tokens = np.random.default_rng(0).integers(0, ONE_BLOCK.vocab_size, 300_000).astype(np.int32)
    task = text_task(tokens, tokens[:2_000], batch_size=tc.batch_size, context=ONE_BLOCK.context,
                     train_eval_windows=4)
    engine = Engine(ONE_BLOCK, tc, n_seeds=seeds)
    shape = (seeds,) if seeds > 1 else ()

    def metrics(lead=()):   # what the real step returns, of the right shapes, computed from nothing
        return {"loss": jnp.ones(lead + shape), "lr": jnp.ones(lead + shape), "grad_norm": jnp.ones(lead + shape),
                "block_grad_norm": jnp.ones(lead + shape + (ONE_BLOCK.n_layers,))}

    engine._step = jax.jit(lambda state, batch: (state, metrics()), donate_argnums=0)
    engine._steps = jax.jit(lambda state, batches: (state, metrics(batches["x"].shape[:1])), donate_argnums=0)
    engine.perplexity = lambda *a, **kw: np.ones(seeds)        # evaluations: the device's work too
    with tempfile.TemporaryDirectory() as workdir:   # compiles what the timed runs use
        used = fit(engine, task, seeds=list(range(seeds)), workdir=workdir, progress=False,
                   steps_per_call=per_call).steps_per_call
    times = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as workdir:
            start = time.perf_counter()
            fit(engine, task, seeds=list(range(seeds)), workdir=workdir, progress=True, steps_per_call=per_call)
            times.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(times), used


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3000, help="steps a run (default 3000, the paper's)")
    p.add_argument("--seeds", default="1,3", help="seed counts to try (default 1,3)")
    p.add_argument("--per-call", default="1,16", help="steps per call to ask for (default 1,16)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    for seeds in map(int, args.seeds.split(",")):
        for asked in map(int, args.per_call.split(",")):
            ms, used = host_ms_per_step(args.steps, seeds, asked, args.repeats)
            print(f"{seeds} seed(s), {used} step(s) per call: {ms:.3f} ms a step on the host "
                  f"({ms * args.steps / 1e3:.1f} s for {args.steps} steps)", flush=True)


if __name__ == "__main__":
    main()
