"""What evaluation costs against training, for the ladder's one-block model at the cpu budget.

    python tools/eval_cost.py [--devices 2]

Times the training step (batch 32, after 3 warm-up steps, mean of 10) and one
`Engine.perplexity` over a 46,000-token held-out split (the size of tiny-shakespeare's; random
ids), then says what the cpu ladder's 9 evaluations a row cost as a share of its training.
README ("More than one process") quotes it: the evaluation windows are split over the
devices like a batch.
"""
from attention_jax.harness.platform import apply_mallopt

apply_mallopt()   # before JAX starts threads, as every command does

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=2, help="JAX CPU devices (default 2)")
    args = p.parse_args()
    import jax
    jax.config.update("jax_num_cpu_devices", args.devices)
    from attention_jax.data import get_batch
    from attention_jax.train import Engine
    from experiments.configs import LADDER_BUDGETS, ONE_BLOCK
    tc = LADDER_BUDGETS["cpu"]
    engine = Engine(ONE_BLOCK, tc)
    state = engine.init([0])
    tokens = np.random.default_rng(0).integers(0, ONE_BLOCK.vocab_size, 500_000).astype(np.int32)
    batches = [engine.shard([dict(zip(("x", "y"), get_batch(tokens, seed=0, step=i, batch_size=tc.batch_size,
                                                            context=ONE_BLOCK.context)))]) for i in range(4)]
    for i in range(3):
        state, metrics = engine.step(state, batches[i % 4])
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for i in range(10):
        state, metrics = engine.step(state, batches[i % 4])
    jax.block_until_ready(metrics)
    step = (time.perf_counter() - start) / 10
    val = tokens[:46_000]
    engine.perplexity(state, val)                 # compile
    start = time.perf_counter()
    engine.perplexity(state, val)
    evaluation = time.perf_counter() - start
    evals = tc.steps // tc.eval_every
    print(f"{jax.device_count()} device(s): step {step * 1e3:.1f} ms (batch {tc.batch_size}); evaluation of "
          f"{len(val):,} tokens {evaluation * 1e3:.0f} ms = {evaluation / step:.1f} steps; {evals} evaluations a row "
          f"= {100 * evals * evaluation / (tc.steps * step):.1f}% of its training")


if __name__ == "__main__":
    main()
