"""What GPT-2 small costs on this machine: load time, memory, and cached decoding.

    python tools/gpt2_cost.py [--tokens 200]

No model hub here, so GPT-2 small's exact shape (config.GPT2_SMALL with GPT-2's tanh GELU,
tied output, q/k/v biases) with random weights is written once in Hugging Face's format by
`pretrained.save` and read back by `pretrained.load`, the path `from_pretrained("gpt2")` takes
after its download, then read in a fresh process (so its memory is the loaded model's). Prints
one Markdown table row per figure.
"""
import argparse
import dataclasses
import resource
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax import pretrained
from attention_jax.config import GPT2_SMALL
from attention_jax.decoding.generate import generate
from attention_jax.model import LanguageModel


def rss_mb() -> float:
    """The process's resident memory now (Linux's /proc), in MB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=200, help="new tokens to decode, cached, greedy")
    p.add_argument("--folder", help=argparse.SUPPRESS)     # the fresh process's: load from here
    args = p.parse_args()
    cfg = dataclasses.replace(GPT2_SMALL, gelu="tanh", output_bias=False, qkv_bias=True, tie_embeddings=True)
    if args.folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            folder = pretrained.save(LanguageModel(cfg, rngs=nnx.Rngs(0)), tmp + "/gpt2-small-shaped")
            sys.exit(subprocess.call([sys.executable, __file__, "--tokens", str(args.tokens), "--folder", str(folder)]))
    before = rss_mb()
    t = time.perf_counter()
    model = pretrained.load(args.folder)
    load_s = time.perf_counter() - t
    loaded = rss_mb()
    prompt = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 16)), jnp.int32)
    t = time.perf_counter()
    jax.block_until_ready(generate(model, prompt, args.tokens, temperature=0.0))
    first = time.perf_counter() - t                         # compiling included
    t = time.perf_counter()
    jax.block_until_ready(generate(model, prompt, args.tokens, temperature=0.0))
    again = time.perf_counter() - t
    n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    print("| figure | value |\n|---|---|")
    print(f"| parameters | {n:,} |")
    print(f"| load (safetensors -> our modules) | {load_s:.2f} s |")
    print(f"| resident memory before loading, after loading | {before:,.0f} MB, {loaded:,.0f} MB |")
    print(f"| {args.tokens} tokens, cached greedy, first call (compiling included) | {first:.1f} s |")
    print(f"| the same again | {again:.1f} s: {1e3 * again / args.tokens:.1f} ms a token |")
    print(f"| the process's peak resident memory, decoding included | {peak_mb():,.0f} MB |")


if __name__ == "__main__":
    main()
