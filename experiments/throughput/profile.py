"""Where the benchmark's training step spends its time: XLA's own ops, from a profiler trace.

    python -m experiments.throughput.profile [--devices N] [--batch B] [--attention A] [--dtype D] [--steps 5] [--top 25]
    python -m experiments.throughput.profile --torch [--dtype float32|bfloat16] [--batch B] [--steps 5] [--top 25]

Builds the same step as the throughput benchmark's "ours" (`worker.jax_contestant`: the
ladder's one-block model through `Engine.step`, glibc's malloc tuned in-process), records
`--steps` steps with `jax.profiler.trace`, and prints the ops that took longest per step:
each op's name as the compiled program calls it, its output shape and the JAX operation it
came from (the HLO metadata), milliseconds and calls per step, summed over the devices. With
N devices running side by side, a step's ops add up to about N times its wall time. Use it to
see what a change to the step would have to beat: e.g. a matmul's GFLOP/s against the
`peak` the benchmark measures. The trace (`.trace.json.gz`, Perfetto's format) is kept with
`--keep DIR`. `--torch` profiles the benchmark's PyTorch twin instead (`torch.profiler`, the
ops' own CPU time per step, without their children's), so the two sides compare op by op.
"""
from __future__ import annotations

import os
import sys

# Imported before jax on purpose, as in the worker: mallopt must act before any thread exists.
from experiments.harness.platform import apply_mallopt

import argparse  # noqa: E402
import collections  # noqa: E402
import glob  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

HLO_LINE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (\(|[a-z]\w*\[[\d,]*\])")
OP_NAME = re.compile(r'op_name="([^"]*)"')


def hlo_ops(hlo_text: str) -> dict[str, tuple[str, str]]:
    """A compiled program's instructions: name -> (output shape, the JAX op it came from)."""
    found = {}
    for line in hlo_text.splitlines():
        m = HLO_LINE.match(line)
        if m:
            origin = OP_NAME.search(line)
            found[m.group(1)] = ("tuple" if m.group(2) == "(" else m.group(2), origin.group(1) if origin else "-")
    return found


def op_times(trace_file: str, steps: int) -> list[tuple[str, float, float]]:
    """(event name, ms per step, calls per step) of a profiler trace's complete events, longest first."""
    with gzip.open(trace_file, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    total, calls = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X":
            total[e["name"]] += e.get("dur", 0)   # microseconds
            calls[e["name"]] += 1
    return [(name, us / 1e3 / steps, calls[name] / steps) for name, us in total.most_common()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.throughput.profile", description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=0, help="JAX CPU devices (0: one per core, as the benchmark)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--attention", default="auto", help="backend: auto, reference, chunked, fused")
    p.add_argument("--dtype", default="float32", help="compute dtype: float32, bfloat16")
    p.add_argument("--steps", type=int, default=5, help="steps recorded")
    p.add_argument("--top", type=int, default=25, help="ops printed")
    p.add_argument("--keep", default=None, help="folder to keep the trace in (default: a temporary one)")
    p.add_argument("--torch", action="store_true", help="profile the PyTorch twin's step instead (torch.profiler)")
    args = p.parse_args(argv)
    if min(args.batch, args.steps, args.top) < 1 or args.devices < 0:
        print("error: --batch, --steps and --top must be positive, --devices 0 or more", file=sys.stderr)
        return 2
    if args.torch:
        return torch_ops(args.batch, args.dtype, args.steps, args.top)
    from experiments.throughput.lineup import cpu_devices
    from experiments.throughput.worker import jax_contestant
    import jax
    # The CPU device count must be set before JAX starts a backend; on a GPU/TPU it changes nothing.
    devices = args.devices or cpu_devices(args.batch)
    step, _, info = jax_contestant(args.batch, devices, attention=args.attention, dtype=args.dtype, with_hlo=True,
                                   per_call=1)   # the one-step program, whose HLO names the ops
    for i in range(3):   # compile and warm the allocator, as the benchmark does
        step(i)
    folder = args.keep or tempfile.mkdtemp(prefix="attention_jax-profile-")
    t = time.perf_counter()
    with jax.profiler.trace(folder, create_perfetto_trace=True):
        for i in range(args.steps):
            step(3 + i)
    wall_ms = (time.perf_counter() - t) * 1e3 / args.steps
    trace_file = max(glob.glob(os.path.join(folder, "**", "*.trace.json.gz"), recursive=True), key=os.path.getmtime)
    ops = hlo_ops(info.pop("hlo"))
    print(f"{info['backend']}, {info['devices']} device(s), batch {args.batch}, {args.attention} attention, "
          f"{args.dtype}: {wall_ms:.1f} ms a step while "
          f"profiled, {args.steps} steps; trace: {trace_file}")
    print(f"{'ms/step':>8} {'calls':>5}  {'op':<28} {'shape':<22} from")
    shown = 0
    for name, ms, n in op_times(trace_file, args.steps):
        if name not in ops:   # the runtime's own spans (executor, waits) and Python's: not XLA ops
            continue
        shape, origin = ops[name]
        print(f"{ms:8.2f} {n:5.1f}  {name:<28} {shape[:22]:<22} {origin[:70]}")
        shown += 1
        if shown == args.top:
            break
    return 0


def torch_ops(batch: int, dtype: str, steps: int, top: int) -> int:
    """The twin's step under torch.profiler: each op's own CPU time per step, longest first."""
    from torch.profiler import ProfilerActivity, profile
    from experiments.configs import ONE_BLOCK
    from experiments.torch_ref import torch_contestant
    step, _, info = torch_contestant(batch, ONE_BLOCK, dtype)
    for i in range(3):
        step(i)
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            step(3 + i)
    wall_ms = (time.perf_counter() - t) * 1e3 / steps
    print(f"torch {info['backend']}, {info['threads']} threads, batch {batch}, {info['dtype']}: {wall_ms:.1f} ms a step "
          f"while profiled, {steps} steps")
    print(f"{'ms/step':>8} {'calls':>5}  op")
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    for e in events[:top]:
        print(f"{e.self_cpu_time_total / 1e3 / steps:8.2f} {e.count / steps:5.1f}  {e.key}")
    return 0


if __name__ == "__main__":
    apply_mallopt()
    sys.exit(main())
