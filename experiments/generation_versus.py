"""Our `generate` against transformers' on one GPT-2, and both against the machine's memory bandwidth.

A GPT-2 with transformers' own random initialisation is saved by transformers and read by our
loader (`attention_jax.pretrained`), so both decode the very same weights, greedily, a batch of
one prompt and a batch of four of unequal lengths (transformers: left padding and an attention
mask; ours: a `Decoder`, made once for each weights dtype, given a list). They take turns, `rounds`
times each, and the medians of milliseconds a token (a call's wall time over its new tokens,
prefill included) are reported; making each `Decoder` (rounding and laying out the weights) is
timed apart, as loading transformers' model is not timed.
Decoding reads every weight once a token, so the floor is the bytes read (the weights, and the
key/value cache) over the fastest of three reads of a large array on this machine (`bandwidth`),
measured before the turns and after.
"""
from __future__ import annotations

import logging
import tempfile
import time

import numpy as np

SHAPES = {"tiny": dict(vocab_size=101, n_positions=64, n_embd=32, n_layer=2, n_head=4),
          "gpt2_small": {}}                   # transformers' defaults are GPT-2 small's
PROMPTS = (16, 9, 12, 5)                      # the batch of four; the batch of one is the first
WEIGHTS = ("float32", "bfloat16", "int8")     # ours; transformers' at float32
BYTES = {"float32": 4, "bfloat16": 2, "int8": 1}


def bandwidth(megabytes: int = 512, rounds: int = 9) -> dict[str, float]:
    """GB/s of three compiled reads of one float32 array of `megabytes`, each the median of `rounds`: its
    sum, its row sums, and one row times it as a [rows, 1024] matrix (decoding's own product,
    `decoding.layout.product`). Any one kernel can read memory slower than the machine allows, and
    which one is fastest changes from machine to machine, so the floor takes the fastest."""
    import jax
    import jax.numpy as jnp
    from attention_jax.decoding.layout import product
    a = jnp.ones((megabytes * 2**20 // 4 // 1024, 1024), jnp.float32)
    row = jnp.ones((1, 1024), jnp.float32)
    reads = {"sum": (jnp.sum, a), "row sums": (lambda m: m.sum(axis=1), a), "row times matrix": (product, row, a)}
    rates = {}
    for name, (fn, *args) in reads.items():
        compiled = jax.jit(fn).lower(*args).compile()
        jax.block_until_ready(compiled(*args))
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            times.append(time.perf_counter() - start)
        rates[name] = a.nbytes / float(np.median(times)) / 1e9
    return rates


def models(shape: str, oracle: bool = True):
    """(ours, transformers') holding one random GPT-2 (transformers' initialisation, seed 0); without the
    oracle (`oracle=False`), (ours with GPT-2's own initialisation, None)."""
    if not oracle:
        from flax import nnx
        from attention_jax import pretrained
        from attention_jax.model import LanguageModel
        return LanguageModel(pretrained.config_from_hf({"model_type": "gpt2", **SHAPES[shape]}), rngs=nnx.Rngs(0)), None
    import torch
    import transformers
    from attention_jax import pretrained
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = transformers.GPT2Config(**SHAPES[shape], attn_implementation="eager")
    hf = transformers.GPT2LMHeadModel(config).eval()
    folder = tempfile.mkdtemp(prefix="attention_jax-gpt2-")
    hf.save_pretrained(folder)
    return pretrained.load(folder), hf


def theirs(hf, prompts: list[np.ndarray], n: int) -> list[np.ndarray]:
    """transformers' greedy `generate`: prompts left-padded, an attention mask, exactly n new tokens each."""
    import torch
    P = max(len(p) for p in prompts)
    ids, mask = np.zeros((len(prompts), P), np.int64), np.zeros((len(prompts), P), np.int64)
    for r, p in enumerate(prompts):
        ids[r, P - len(p):], mask[r, P - len(p):] = p, 1
    with torch.no_grad():
        out = hf.generate(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), max_new_tokens=n,
                          min_new_tokens=n, do_sample=False, pad_token_id=0).numpy()
    return [np.concatenate([p, row[P:]]) for p, row in zip(prompts, out)]


def ours(decoder, prompts: list[np.ndarray], n: int) -> list[np.ndarray]:
    return decoder(prompts, n, temperature=0)


def decoders(model) -> tuple[dict, dict]:
    """A `Decoder` for each weights dtype raced, and the milliseconds each took to make."""
    import jax
    from attention_jax.decoding.generate import Decoder
    made, ms = {}, {}
    for weights in WEIGHTS:
        start = time.perf_counter()
        made[weights] = Decoder(model, weights=weights)
        jax.block_until_ready(made[weights].state)
        ms[weights] = 1e3 * (time.perf_counter() - start)
    return made, ms


def bytes_a_token(model, batch: int, slots: int, weights: str) -> int:
    """What one decoding step reads: every parameter (matrices in `weights`; int8's scales, 0.3%, left
    out) and the whole key/value cache."""
    import jax
    from flax import nnx
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    params = sum(a.size * (BYTES[weights] if a.ndim >= 2 else 4) for a in leaves)
    cfg = model.config
    return params + 2 * cfg.n_layers * batch * slots * cfg.d_model * 4


def race(shape: str, n: int, rounds: int, oracle: bool = True) -> dict:
    """Every setting's median ms a token, its floor, and whether the tokens agree; without the oracle
    (transformers and torch), ours alone, transformers' rows "not measured"."""
    from attention_jax.decoding.generate import rounded
    from experiments.harness.oracles import NOT_MEASURED
    model, hf = models(shape, oracle)
    decoder, prepare_ms = decoders(model)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    batches = {1: [rng.integers(0, vocab, PROMPTS[0])]}
    batches[4] = [batches[1][0], *(rng.integers(0, vocab, k) for k in PROMPTS[1:])]
    contestants = [("ours", w) for w in WEIGHTS] + ([("transformers", "float32")] if oracle else [])
    settings = [(who, w, b) for b in (1, 4) for who, w in contestants]
    run = lambda who, w, b: ours(decoder[w], batches[b], n) if who == "ours" else theirs(hf, batches[b], n)
    texts = {s: run(*s) for s in settings}                         # the first call of each compiles
    before = bandwidth()             # and after the turns: the machine's speed drifts, the floor takes its best
    times = {s: [] for s in settings}
    for _ in range(rounds):
        for s in settings:
            start = time.perf_counter()
            run(*s)
            times[s].append(1e3 * (time.perf_counter() - start) / n)
    probes = {name: max(rate, before[name]) for name, rate in bandwidth().items()}
    gbs = max(probes.values())
    rows = []
    for who, w, b in settings:
        need = bytes_a_token(model, b, max(PROMPTS[:b]) + n - 1, w)
        ms = float(np.median(times[(who, w, b)]))
        rows.append(dict(who=who, weights=w, batch=b, ms=ms, mb=need / 2**20, floor_ms=1e3 * need / (gbs * 1e9),
                         times=times[(who, w, b)]))
        rows[-1]["of_floor"] = ms / rows[-1]["floor_ms"]
    if not oracle:
        rows += [dict(who="transformers", weights="float32", batch=b, ms=NOT_MEASURED, mb=NOT_MEASURED,
                      floor_ms=NOT_MEASURED, of_floor=NOT_MEASURED, times=[]) for b in (1, 4)]
    ids = np.stack([t[:PROMPTS[0] + n] for t in texts[("ours", "float32", 1)]])
    full = lambda m: np.asarray(m(ids))
    exact, low, int8 = full(model), full(rounded(model, "bfloat16")), full(rounded(model, "int8"))
    same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(a, b))
    first = lambda a, b: int(np.argmax(np.append(a[0] != b[0], True)))
    alone = [ours(decoder["float32"], [p], n)[0] for p in batches[4]]
    import jax
    from flax import nnx
    threads = __import__("torch").get_num_threads() if oracle else None
    return {"shape": shape, "params": sum(int(a.size) for a in jax.tree.leaves(nnx.state(model, nnx.Param))), "new": n,
            "bandwidth_gbs": gbs, "bandwidth_probes": probes, "oracle": oracle,
            "torch_threads": threads, "rows": rows, "prepare_ms": prepare_ms,
            "tokens_equal": {b: same(texts[("ours", "float32", b)], texts[("transformers", "float32", b)])
                             for b in (1, 4)} if oracle else None,
            "batch_equals_alone": same(texts[("ours", "float32", 4)], alone),
            "transformers_batch_equals_alone": same(texts[("transformers", "float32", 4)],
                                                    [theirs(hf, [p], n)[0] for p in batches[4]]) if oracle else None,
            "bf16_same_tokens": first(texts[("ours", "bfloat16", 1)], texts[("ours", "float32", 1)]) - PROMPTS[0],
            "bf16_logit_diff": float(np.abs(low - exact).max()), "logit_std": float(exact.std()),
            "int8_same_tokens": first(texts[("ours", "int8", 1)], texts[("ours", "float32", 1)]) - PROMPTS[0],
            "int8_logit_diff": float(np.abs(int8 - exact).max())}
