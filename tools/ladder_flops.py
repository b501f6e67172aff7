"""The paper-preset ladder's arithmetic, counted by XLA: what bounds the device check's time on a GPU.

    python tools/ladder_flops.py

For each ladder row, the FLOPs of one training step at the paper preset's batch as XLA's cost
analysis counts them (the program built for a GPU: fused attention, the accelerator's dense
backward), times the preset's steps; and the seconds that total takes at a given share of a
GPU's matmul peak. docs/performance.md ("On a GPU") quotes its output.
"""
from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--peak", type=float, default=400.0, help="the GPU's matmul peak in TFLOP/s (H100 TF32: ~400)")
    p.add_argument("--mfu", type=float, default=0.05, help="the share of that peak a step this small reaches")
    args = p.parse_args()
    from attention_jax.train import Engine
    from experiments.configs import LADDER, LADDER_BUDGETS
    tc, total = LADDER_BUDGETS["paper"], 0.0
    for row in LADDER:
        engine = Engine(row.config, tc, backend="cuda")
        x = np.zeros((tc.batch_size, row.config.context), np.int32)
        analysis = engine._step.lower(engine.init([0]), engine.shard([{"x": x, "y": x}])).compile().cost_analysis()
        flops = (analysis[0] if isinstance(analysis, list) else analysis)["flops"]
        total += flops * tc.steps
        print(f"{row.name:18} {flops / 1e9:7.2f} GFLOP a step, {flops * tc.steps / 1e12:6.1f} TFLOP for {tc.steps} steps")
    print(f"all ten rows: {total / 1e12:.0f} TFLOP; at {args.mfu:.0%} of {args.peak:.0f} TFLOP/s: "
          f"{total / (args.peak * 1e12 * args.mfu):.0f} s of arithmetic")


if __name__ == "__main__":
    main()
