"""What evaluation costs against training, for the throughput benchmark's one-block step.

    python tools/eval_cost.py [--devices 2]

Times the benchmark's training step at the cpu ladder's batch of 32 (`experiments.throughput.
worker.jax_contestant`; after 3 warm-up steps, mean of 10) and one `Engine.perplexity` over a
46,000-token held-out split (the size of tiny-shakespeare's; random ids), then says what the
cpu ladder's 9 evaluations a row would cost as a share of its training. docs/performance.md
("Evaluation over several devices") quotes it: the evaluation windows are split over the devices like a batch.
"""
from experiments.harness.platform import apply_mallopt

apply_mallopt()   # before JAX starts threads, as every command does

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=2, help="JAX CPU devices (default 2)")
    args = p.parse_args()
    from experiments.configs import LADDER_BUDGETS
    from experiments.throughput.worker import VOCAB, jax_contestant
    tc = LADDER_BUDGETS["cpu"]
    step, _, info = jax_contestant(tc.batch_size, args.devices, with_eval=True, per_call=1)   # one step a call
    for i in range(3):
        step(i)
    start = time.perf_counter()
    for i in range(10):
        step(3 + i)
    seconds = (time.perf_counter() - start) / 10
    val = np.random.default_rng(1).integers(0, VOCAB, 46_000).astype(np.int32)
    info["perplexity"](val)                       # compile
    start = time.perf_counter()
    info["perplexity"](val)
    evaluation = time.perf_counter() - start
    evals = tc.steps // tc.eval_every
    print(f"{info['devices']} device(s): step {seconds * 1e3:.1f} ms (batch {tc.batch_size}); evaluation of "
          f"{len(val):,} tokens {evaluation * 1e3:.0f} ms = {evaluation / seconds:.1f} steps; {evals} evaluations a "
          f"row = {100 * evals * evaluation / (tc.steps * seconds):.1f}% of its training")


if __name__ == "__main__":
    main()
