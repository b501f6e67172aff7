"""The engine's compiled programs as text, without their source metadata: to show that a refactor left
the computation alone, compare two checkouts' outputs.

    PYTHONPATH=/path/to/a python tools/step_hlo.py > a.txt
    PYTHONPATH=/path/to/b python tools/step_hlo.py > b.txt && diff a.txt b.txt && echo identical

One line per program (the step and the summed NLL of the ladder's one-block model, the tiny GPT and the
two-block ladder row, batch 8) with the sha256 of its instructions, then `--full NAME` prints one
program's instructions. File names, line numbers and stack frames are dropped: they change when code
moves, the program does not.
"""
from __future__ import annotations

import argparse
import hashlib
import re

import numpy as np


def instructions(hlo: str) -> list[str]:
    """The HLO module's computations and instructions, their source locations dropped."""
    keep = [line for line in hlo.splitlines()
            if ("=" in line and "%" in line) or line.strip().startswith(("ENTRY", "}", "ROOT"))]
    return [re.sub(r",? ?(metadata=\{[^}]*\}|stack_frame_id=\d+)", "", line) for line in keep]


def programs() -> dict[str, list[str]]:
    from attention_jax.train import Engine, TrainConfig
    from experiments.configs import LADDER, ONE_BLOCK, TINY_GPT
    found = {}
    for name, config in (("one_block", ONE_BLOCK), ("tiny_gpt", TINY_GPT), ("two_blocks", LADDER[-1].config)):
        engine = Engine(config, TrainConfig(batch_size=8))
        state, x = engine.init([0]), np.zeros((8, config.context), np.int32)
        batch = engine.shard([{"x": x, "y": x}])
        found[f"{name}.step"] = instructions(engine._step.lower(state, batch).compile().as_text())
        windows = engine._windows(x)
        found[f"{name}.nll"] = instructions(engine._nll.lower(state, windows, windows, None).compile().as_text())
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--full", metavar="NAME", help="print this program's instructions (e.g. one_block.step)")
    args = p.parse_args()
    for name, lines in programs().items():
        if args.full == name:
            print("\n".join(lines))
        elif not args.full:
            print(f"{name}: {len(lines)} lines, sha256 {hashlib.sha256(chr(10).join(lines).encode()).hexdigest()[:16]}")


if __name__ == "__main__":
    main()
