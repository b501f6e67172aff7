"""How long the paper-preset runs should take on a GPU or TPU: an estimate from their arithmetic and
each device's published peak, until a measured run replaces it.

    python -m experiments.estimates            # the table, as docs/performance.md shows it
    python -m experiments.estimates --write    # docs/estimates.json and that table, regenerated
    python -m experiments.estimates --device "Tesla T4"   # one device's line (tools/device_check.sh)

A training step's FLOPs are counted from its `ModelConfig` (`step_flops`): every product of the
forward pass, 2 FLOPs a multiply-add, the attention scores over the whole T x T (as XLA's kernel
computes them; cuDNN's skips the masked half), times 3 for the backward; the embedding lookup,
softmax, LayerNorm and the optimizer are left out (within 5% of XLA's own count of a ladder step:
tests/test_estimates.py). Minutes = FLOPs / (the device's dense half-precision peak x `UTILISATION`), where
`UTILISATION` is the one published measurement of a model this small found: nanoGPT's
character-level Shakespeare run (6 layers of width 384, context 256, batch 64, 5,000 steps) "takes
about 3 minutes" on one A100 (its README), which is that run's training FLOPs, counted the same
way, over 3 minutes at the A100's 312 TFLOP/s: its compiles and evaluations are inside those 3
minutes. The ladder's rows are narrower (width 128), which favours fixed costs: these are
estimates, marked so, and nothing here has run on any of these devices.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import sys

from attention_jax.config import ModelConfig, TrainConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "estimates.json"
PAGE = ROOT / "docs" / "performance.md"
LADDER, NOTEBOOK = "ladder --preset paper", "the notebook (paper: ladder x 3 seeds, tiny GPT, induction)"
BEGIN, END = "<!-- estimates: python -m experiments.estimates --write -->", "<!-- end of the estimates -->"


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    kinds: tuple[str, ...]     # what jax's device_kind says, in part
    dtype: str                 # `attention_jax.speed.dtype_for`'s choice there
    peak: float                # dense tensor TFLOP/s in that dtype, from the vendor's datasheet
    source: str


# Dense (no structured sparsity) half-precision peaks: NVIDIA's datasheets give the sparse figure
# with an asterisk, twice the dense one.
DEVICES = (
    Device("T4", ("T4",), "float16", 65.0, "NVIDIA T4 datasheet: mixed precision (FP16/FP32) 65 TFLOPS, "
           "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"),
    Device("L4", ("L4",), "bfloat16", 121.0, "NVIDIA L4 datasheet: BF16 tensor core 242 TFLOPS with sparsity, "
           "121 dense, https://www.nvidia.com/en-us/data-center/l4/"),
    Device("A100", ("A100",), "bfloat16", 312.0, "NVIDIA A100 datasheet: BFLOAT16 tensor core 312 TFLOPS (624 with "
           "sparsity), https://www.nvidia.com/en-us/data-center/a100/"),
    Device("H100", ("H100",), "bfloat16", 989.0, "NVIDIA H100 SXM datasheet: BF16 tensor core 1,979 TFLOPS with "
           "sparsity, 989 dense (the PCIe card: 1,513, 756 dense), https://www.nvidia.com/en-us/data-center/h100/"),
    Device("TPU v5e-1", ("v5 lite", "v5e"), "bfloat16", 197.0, "Google Cloud TPU v5e: peak compute per chip (bf16) "
           "197 TFLOPs, https://cloud.google.com/tpu/docs/v5e"),
)

# nanoGPT's config/train_shakespeare_char.py and README ("On one A100 GPU this training run takes
# about 3 minutes"): 65 characters, tied embeddings, no biases.
NANOGPT = ModelConfig(vocab_size=65, context=256, d_model=384, n_layers=6, n_heads=6, tie_embeddings=True,
                      bias=False)
NANOGPT_RUN = dict(batch=64, steps=5000, seconds=180.0, peak=312.0,
                   source="https://github.com/karpathy/nanoGPT (README, config/train_shakespeare_char.py)")


def forward_flops_per_token(c: ModelConfig) -> float:
    """Every product of one position's forward pass, 2 FLOPs a multiply-add: the mixer's projections
    and scores (the average's T weights, or q·k and the weights times v over all T), the
    feed-forward, the output layer."""
    d, T, per_layer = c.d_model, c.context, 0.0
    if c.mixer == "average":
        per_layer += 2 * T * d
    elif c.mixer in ("head", "heads"):
        inner = c.heads_used * c.d_head_used
        per_layer += 2 * 3 * d * inner + (2 * inner * d if c.mixer == "heads" else 0) + 2 * 2 * T * inner
    if c.feed_forward:
        per_layer += 2 * 2 * d * c.d_ff
    return c.n_layers * per_layer + 2 * d * c.output_size_used


def step_flops(c: ModelConfig, batch: int) -> float:
    """One training step: forward and backward (twice the forward's products)."""
    return 3 * forward_flops_per_token(c) * batch * c.context


def utilisation() -> float:
    """nanoGPT's measured share of the A100's peak: its training FLOPs over its 3 minutes."""
    r = NANOGPT_RUN
    return step_flops(NANOGPT, r["batch"]) * r["steps"] / (r["seconds"] * r["peak"] * 1e12)


def runs() -> dict[str, list[tuple[str, ModelConfig, TrainConfig, int]]]:
    """The paper-preset runs, each (row, config, budget, seeds): the ladder, the positions table, and
    what the notebook trains on a GPU/TPU (the ladder with 3 seeds, the tiny GPT, induction)."""
    from experiments import induction, ladder, positions
    from experiments.inside_tiny_gpt import constants as tiny
    paper = ladder.PRESETS["paper"]
    ladder_rows = [(r.name, r.config, paper, 1) for r in ladder.ROWS]
    shapes = induction.SHAPES["paper"]
    return {
        LADDER: ladder_rows,
        "positions --preset paper": [(n, c, positions.PRESETS["paper"], 1) for n, c in positions.ROWS],
        NOTEBOOK:
            [(n, c, t, 3) for n, c, t, _ in ladder_rows]
            + [(tiny.ROW, tiny.CONFIG, tiny.PRESETS["paper"], 1)]
            + [(n, induction.config(n, shapes), induction.PRESETS["paper"], 1) for n in induction.ROWS],
    }


def estimate() -> dict:
    """Each run's training TFLOP and, on each device, its estimated minutes: what docs/estimates.json
    holds."""
    share = utilisation()
    out = {"utilisation": round(share, 4), "basis": NANOGPT_RUN["source"],
           "devices": [dataclasses.asdict(d) for d in DEVICES], "runs": {}}
    for name, rows in runs().items():
        flops = sum(step_flops(c, t.batch_size) * t.steps * seeds for _, c, t, seeds in rows)
        out["runs"][name] = {"tflop": round(flops / 1e12, 1), "minutes": {
            d.name: round(flops / (d.peak * 1e12 * share) / 60, 2) for d in DEVICES}}
    return out


def shown(minutes: float) -> str:
    return f"{60 * minutes:.0f} s" if minutes < 1 else f"{minutes:.1f} min"


def table(data: dict) -> str:
    """docs/performance.md's table, from the results file's numbers: a device's column names its
    dtype and dense peak in TFLOP/s and links its datasheet; every cell an estimate."""
    url = lambda d: re.search(r"https://\S+", d["source"]).group(0)
    head = [f"run, at {data['utilisation']:.1%} of each peak", "TFLOP"] + [
        f"[{d['name']}]({url(d)}), {d['dtype']}, {d['peak']:g}" for d in data["devices"]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in data["runs"].items():
        cells = [f"{shown(r['minutes'][d['name']])} (est.)" for d in data["devices"]]
        lines.append(f"| `{name}` | {r['tflop']:,.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def block(data: dict) -> str:
    return f"{BEGIN}\n{table(data)}\n{END}"


def page_block(text: str) -> str | None:
    found = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, re.S)
    return found.group(0) if found else None


def for_device(kind: str, run: str = LADDER) -> str:
    """One line for the device check and the notebook: the run's estimate on the device JAX names
    `kind` (its device_kind), and twice it (room for a second try)."""
    data = estimate()
    device = next((d for d in data["devices"] if any(k.lower() in kind.lower() for k in d["kinds"])), None)
    if device is None:
        return f"estimate: no published peak here for {kind!r} ({', '.join(d['name'] for d in data['devices'])} known)"
    minutes = data["runs"][run]["minutes"][device["name"]]
    return (f"estimate: {run} is {data['runs'][run]['tflop']:,.0f} TFLOP of training; at {data['utilisation']:.1%} "
            f"of the {device['name']}'s {device['peak']:g} TFLOP/s ({device['dtype']}): {60 * minutes:.0f} s, "
            f"{120 * minutes:.0f} s with a second try (docs/performance.md)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--write", action="store_true", help="write docs/estimates.json and docs/performance.md's table")
    p.add_argument("--device", default=None, metavar="KIND", help="one device's line (jax's device_kind)")
    args = p.parse_args(argv)
    if args.device is not None:
        print(for_device(args.device))
        return 0
    data = estimate()
    if args.write:
        RESULTS.write_text(json.dumps(data, indent=1) + "\n")
        text = PAGE.read_text()
        old = page_block(text)
        if old is None:
            print(f"error: {PAGE} has no {BEGIN} ... {END} block; add one where the table goes", file=sys.stderr)
            return 2
        PAGE.write_text(text.replace(old, block(data)))
    print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
