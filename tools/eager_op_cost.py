"""What one eager JAX op costs the test suite on a CPU, with and without one MLIR context shared.

    python tools/eager_op_cost.py [--rounds 4] [--shapes 40]

Most of a cold suite's programs are single eager ops (an `x * 2` on a new shape compiles a
program of its own). This runs a few eager ops on each of `--shapes` new shapes per round, with the
suite's XLA flags (tests/conftest.py) and no compilation cache, alternating rounds in which
JAX makes a fresh MLIR context per program (its default) with rounds in which the program
lowering shares one (tests/helpers.py `share_mlir_contexts`, as the suite's processes do), and
prints each round's milliseconds per program compiled, and the medians. CONTRIBUTING.md ("What keeps the suite fast") quotes it.
"""
import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

TESTS = pathlib.Path(__file__).resolve().parents[1] / "tests"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4, help="rounds of each kind, alternating (default 4)")
    p.add_argument("--shapes", type=int, default=40, help="new shapes a round (default 40)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.shapes < 1:
        p.error("--rounds and --shapes must be at least 1")
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"      # read when jax is imported
    sys.path.insert(0, str(TESTS))
    from conftest import TEST_XLA_FLAGS, known_xla_flags      # the suite's flags, read when XLA starts
    flags = known_xla_flags(TEST_XLA_FLAGS, tempfile.gettempdir())
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    import jax
    import jax.monitoring
    import jax.numpy as jnp
    from jax._src.interpreters import mlir
    import helpers
    fresh = mlir.make_ir_context
    helpers.share_mlir_contexts()
    shared = mlir.make_ir_context
    assert shared is not fresh, "this JAX has no mlir.make_ir_context to share"
    compiled = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **_: compiled.append(1) if event == "/jax/core/compile/backend_compile_duration" else None)
    rows = 1
    ms = {"fresh": [], "shared": []}
    for _ in range(args.rounds):
        for kind, make in (("fresh", fresh), ("shared", shared)):
            mlir.make_ir_context = make
            t0, before = time.perf_counter(), len(compiled)
            for _ in range(args.shapes):
                x = jnp.ones((rows, 3), jnp.float32)        # a shape no earlier op has seen
                y = jnp.exp(jnp.where(x * 2.0 + 1 > 2, x, 0).sum(0))
                rows += 1
            jax.block_until_ready(y)
            ms[kind].append(1000 * (time.perf_counter() - t0) / (len(compiled) - before))
            print(f"{kind:6s} context: {ms[kind][-1]:5.1f} ms per program compiled", flush=True)
    f, s = statistics.median(ms["fresh"]), statistics.median(ms["shared"])
    print(f"median: fresh {f:.1f} ms, shared {s:.1f} ms per program compiled ({s / f:.0%} of fresh)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
