"""Inside a real GPT-2: its attention, what each head is worth, the residual stream and a logit lens.

`python -m experiments.gpt2 --model gpt2` loads GPT-2's own weights (the hub, or a folder
holding config.json, model.safetensors and tokenizer.json: `--model path/to/folder`) into our
modules and runs the lecture's probes on one text: each layer's attention maps, every head
ablated in turn (the loss on the text without it), the norm each component writes into the
residual stream, a logit lens (each block's stream through the final LayerNorm and the
unembedding) and a cached greedy continuation. The smoke preset makes a tiny random GPT-2
checkpoint with our own `pretrained.save` and probes that: plumbing, offline.
"""
from __future__ import annotations

import pathlib
import time

import numpy as np

from attention_jax.errors import ConfigError
from experiments.harness import report
from experiments.harness.experiment import Experiment, Result

NAME = "gpt2"
TEXT = "When Mary and John went to the store, John gave a drink to"
PRESETS = {"smoke": dict(model=None, new=8), "cpu": dict(model="gpt2", new=20), "paper": dict(model="gpt2", new=20)}


def flags(p) -> None:
    p.add_argument("--model", default=None, metavar="NAME|FOLDER",
                   help="a hub name (gpt2, gpt2-medium, ...) or a folder of its files (default: the preset's)")
    p.add_argument("--text", default=TEXT, help="the text the probes read")


def tiny_checkpoint(folder):
    """A GPT-2-shaped model with random weights, saved as Hugging Face would: the smoke preset's."""
    from flax import nnx
    from attention_jax import pretrained
    from attention_jax.config import ModelConfig
    from attention_jax.model import LanguageModel
    config = ModelConfig(vocab_size=256, context=64, d_model=32, n_layers=2, n_heads=4, tie_embeddings=True,
                         qkv_bias=True, output_bias=False, gelu="tanh", init="gpt2")
    return pretrained.save(LanguageModel(config, rngs=nnx.Rngs(0)), folder)


def probes(model, ids: np.ndarray) -> dict:
    """Attention maps, head ablations, component norms and the logit lens on one text [T]."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from attention_jax.analysis.inspect import logit_lens, patched, run_with_cache
    from attention_jax.speed import fast
    x, y = jnp.asarray(ids[None, :-1]), jnp.asarray(ids[None, 1:])
    L, H = model.config.n_layers, model.config.n_heads
    loss = lambda logits: float(-jnp.take_along_axis(jax.nn.log_softmax(logits[0]), y[0][:, None], 1).mean())
    logits, cache = run_with_cache(model, x, ["blocks.*.mixer.attention.weights", "blocks.*.mixer_out",
                                              "blocks.*.ffn_out", "embed", "positions"])
    lens = logit_lens(model, x)

    @nnx.jit
    def without(model, keep):   # the heads where keep = 0 zeroed after their softmax, one compile for all
        zero = lambda i: lambda z: z * keep[i].astype(z.dtype)[:, None, None]
        with patched(model, {f"blocks.{i}.mixer.z": zero(i) for i in range(L)}), fast(model):
            return model(x)

    base = loss(logits)
    ablated = np.zeros((L, H))
    for i in range(L):
        for h in range(H):
            ablated[i, h] = loss(without(model, jnp.ones((L, H)).at[i, h].set(0))) - base
    weights = np.stack([np.asarray(cache[f"blocks.{i}.mixer.attention.weights"][0]) for i in range(L)])   # [L, H, T, T]
    norm = lambda a: float(np.linalg.norm(np.asarray(a)[0], axis=-1).mean())
    components = [{"part": "embedding + positions", "norm": norm(cache["embed"] + cache["positions"])}]
    for i in range(L):
        components += [{"part": f"block {i} attention", "norm": norm(cache[f"blocks.{i}.mixer_out"])},
                       {"part": f"block {i} MLP", "norm": norm(cache[f"blocks.{i}.ffn_out"])}]
    probs = jax.nn.softmax(lens.astype(jnp.float32), axis=-1)[:, 0]                           # [L + 1, T, V]
    truth = np.asarray(jnp.take_along_axis(probs, y[0][None, :, None], 2)[..., 0]).mean(1)   # per layer
    return {"loss": base, "ablated": ablated, "weights": weights, "components": components, "truth": truth,
            "top": np.asarray(lens[:, 0, -1].argmax(-1)),
            "lens_matches": float(jnp.abs(lens[-1] - logits).max()),
            "future": float(np.triu(weights, k=1).sum())}


def figures(found: dict, title: str) -> dict:
    w, ablated = found["weights"], found["ablated"]
    L, H = ablated.shape
    fig, axes = report.figure(ncols=min(L, 6), size=(3.2 * min(L, 6) + 1, 3.6), squeeze=False)
    for ax, i in zip(axes[0], range(L)):
        image = ax.imshow(w[i].mean(0), cmap="magma", vmin=0, vmax=1)
        ax.set(title=f"block {i}, heads averaged", xlabel="key position", ylabel="query position" if i == 0 else "")
    fig.colorbar(image, ax=list(axes[0]), shrink=0.8, label="attention weight")
    fig.suptitle(f"{title}\n(first {min(L, 6)} blocks)", fontsize=10)
    fig2, (a1, a2, a3) = report.figure(ncols=3, size=(17, 4.8))
    image = a1.imshow(ablated, cmap="RdBu_r", vmin=-abs(ablated).max(), vmax=abs(ablated).max(), aspect="auto")
    a1.set(title="loss change with one head off (nats)", xlabel="head", ylabel="block")
    a1.set_xticks(range(H)), a1.set_yticks(range(L))
    fig2.colorbar(image, ax=a1)
    parts = found["components"]
    a2.barh(range(len(parts)), [c["norm"] for c in parts])
    a2.set_yticks(range(len(parts)), [c["part"] for c in parts], fontsize=7)
    a2.invert_yaxis()
    a2.set(title="what each component writes (mean L2 norm)", xlabel="norm")
    a3.plot(range(len(found["truth"])), found["truth"], "o-")
    a3.set_xticks(range(len(found["truth"])))
    a3.set(title="logit lens: p(the next token)", xlabel="after block (0: the embedding)", ylabel="probability",
           ylim=(0, max(1e-3, float(max(found["truth"]))) * 1.1))
    fig2.suptitle(title, fontsize=10)
    return {"attention.png": fig, "probes.png": fig2}


def run(ctx) -> Result:
    from attention_jax import pretrained
    from attention_jax.decoding.generate import generate
    from attention_jax.parameters import count_params
    p, args = ctx.settings, ctx.args
    source = args.model or p["model"]
    if source is None:
        source = str(tiny_checkpoint(ctx.folder / "tiny-gpt2"))
    t0 = time.perf_counter()
    model = pretrained.from_pretrained(source)
    load_s = time.perf_counter() - t0
    folder = source if pathlib.Path(source).expanduser().is_dir() else pretrained.fetch(source)
    if any((pathlib.Path(folder) / f).is_file() for f in ("tokenizer.json", "vocab.json")):
        tokenizer = pretrained.tokenizer(folder)         # a damaged one is one line (DataError), not bytes as ids
        ids, decode = np.asarray(tokenizer.encode(args.text).ids), lambda t: tokenizer.decode([int(t)])
    else:                      # a checkpoint without its tokenizer (the smoke's): bytes as ids
        ids = np.frombuffer(args.text.encode(), np.uint8).astype(np.int64) % model.config.vocab_size
        decode = lambda t: repr(chr(int(t)))[1:-1] if 32 <= int(t) < 127 else f"<{int(t)}>"
    if len(ids) < 2:
        raise ConfigError(f"--text {args.text!r} is {len(ids)} token(s); the probes read a next token, so give at "
                          "least two")
    ids = ids[: model.config.context]
    found = probes(model, ids)
    t1 = time.perf_counter()
    room = model.config.context - p["new"] + 1          # the cache holds the prompt and the new tokens but the last
    more = generate(model, ids[: len(ids) - 1][-room:], p["new"], temperature=0)
    ids = ids[: len(ids) - 1][-room:]                   # the continuation follows the prompt it was given
    per_token = 1e3 * (time.perf_counter() - t1) / p["new"]
    cfg = model.config
    heads = sorted(((found["ablated"][i, h], i, h) for i in range(cfg.n_layers) for h in range(cfg.n_heads)),
                   reverse=True)[:10]
    rows = [{"block": i, "head": h, "loss_change": d} for d, i, h in heads]
    lens_rows = [{"after": "embedding" if i == 0 else f"block {i - 1}", "p_next": float(found["truth"][i]),
                  "top": decode(found["top"][i])} for i in range(len(found["truth"]))]
    continuation = "".join(decode(t) for t in more[len(ids):])
    claims = [report.claim("attention puts exactly zero weight on the future", found["future"] == 0.0,
                           f"{found['future']} summed over every layer and head"),
              report.claim("the logit lens after the last block is the model's own logits",
                           found["lens_matches"] < 1e-4, f"max |diff| {found['lens_matches']:.2g}")]
    title = f"{source}: {cfg.n_layers} blocks x {cfg.n_heads} heads, d {cfg.d_model} ({ctx.preset} preset)"
    tables = {"The ten heads whose loss matters most (loss on the text without the head, minus with it)":
              report.format_table([("block", "block", "d"), ("head", "head", "d"), ("loss_change", "loss change",
                                                                                 "+.4f")], rows),
              "Logit lens: the last position's most likely next token after each block":
              report.format_table([("after", "after", ""), ("p_next", "p(true next), mean", ".4f"),
                                   ("top", "top token at the last position", "")], lens_rows),
              "Cost here": report.format_table([("what", "", ""), ("value", "", "")], [
                  {"what": "parameters", "value": f"{count_params(cfg):,}"},
                  {"what": "load (s)", "value": f"{load_s:.2f}"},
                  {"what": "greedy, cached (ms a token, compile included)", "value": f"{per_token:.1f}"},
                  {"what": f"continuation of the text ({p['new']} tokens)", "value": continuation}])}
    return Result(rows=rows, claims=claims, tables=tables, figures=figures(found, title),
                  config={"model": source, "text": args.text, "model_config": cfg.to_dict()},
                  extra={"loss": found["loss"], "components": found["components"], "lens": lens_rows,
                         "ablated": found["ablated"].tolist(), "load_s": load_s, "ms_per_token": per_token})


EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run, flags=flags, smoke_decides=True)   # exact claims
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
