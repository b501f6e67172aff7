# ---
# jupyter:
#   jupytext:
#     formats: ipynb,source//py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Attention, derived from a plain average, in JAX
#
# This notebook runs the chapter's main table, the ablation ladder, and looks inside the
# models it trains. On a Colab GPU or TPU runtime it trains the book's budget (the `paper`
# preset, three seeds at once through `vmap`); on a CPU it runs the `smoke` preset, a
# plumbing check whose numbers mean nothing, in about a minute.
#
# Every cell checks what it shows with an `assert`, so a notebook that runs to the end has
# verified its own output.

# %% [markdown]
# ## 1. Install for the runtime found
#
# Colab ships an older jax with its own CUDA plugin; this project needs jax >= 0.10. Upgrading
# jax alone leaves the plugin behind and JAX silently falls back to the CPU, so the project and
# a matched jax (`jax[cuda12]` on a GPU, `jax[tpu]` on a TPU) are installed in **one** pip
# command. If jax was already imported in this session, restart the runtime after installing.
# The cell then picks the dtype this device trains fastest in and says which: float16 on a T4
# (compute capability 7.5: float16 tensor cores only, trained with a dynamic loss scale),
# bfloat16 on an L4, A100 or H100 (8.0 and up) and on a TPU, float32 on a CPU.

# %%
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

REPO = "https://github.com/attention-jax/attention_jax"   # the project's public repository


# TPU chips' PCI device ids under Google's vendor id 0x1ae0 (v3 ... TPU7x), as jax/_src/hardware_utils.py
# lists them; the same vendor id also names Google's virtual NIC, so the device id must match too.
TPU_PCI_DEVICES = {"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"}


def tpu_on_pci() -> bool:
    """A TPU chip attached to this VM (v5e/v6e runtimes show no /dev/accel*, only the PCI device)."""
    for vendor in pathlib.Path("/sys/bus/pci/devices").glob("*/vendor"):
        try:
            if vendor.read_text().strip() == "0x1ae0" and (vendor.parent / "device").read_text().strip() in TPU_PCI_DEVICES:
                return True
        except OSError:
            continue
    return False


def runtime() -> str:
    """What this machine offers: 'gpu', 'tpu' or 'cpu' (without importing jax)."""
    if (os.environ.get("COLAB_TPU_ADDR") or os.environ.get("TPU_NAME") or list(pathlib.Path("/dev").glob("accel*"))
            or tpu_on_pci()):
        return "tpu"
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        return "gpu"
    return "cpu"


EXPECTED = runtime()
if importlib.util.find_spec("attention_jax") is None:        # not installed yet (a fresh Colab runtime)
    extra = {"gpu": "[gpu]", "tpu": "[tpu]", "cpu": ""}[EXPECTED]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"attention_jax{extra} @ git+{REPO}"], check=True)

import jax  # noqa: E402

from experiments.harness.platform import backend_summary, check_backend  # noqa: E402

from attention_jax.speed import dtype_for  # noqa: E402

print(backend_summary())
assert check_backend() is None, check_backend()              # a CUDA plugin installed but JAX on the CPU
assert jax.default_backend() == EXPECTED, f"expected {EXPECTED}, JAX runs on {jax.default_backend()}"
DTYPE, WHY = dtype_for()                                     # this device's
print(f"training dtype: {DTYPE} ({jax.devices()[0].device_kind}: {WHY})")
capability = float(getattr(jax.devices()[0], "compute_capability", None) or 8.0)   # "7.5" on a T4
assert DTYPE == {"gpu": "float16" if capability < 8.0 else "bfloat16", "tpu": "bfloat16", "cpu": "float32"}[EXPECTED]

# %% [markdown]
# ## 2. Why the scores are divided by √d: the softmax's Jacobian
#
# One query against 64 keys of width 256: the raw dot products have a standard deviation of
# about √256 = 16, so the softmax has already chosen one key and its Jacobian
# `diag(w) − w wᵀ` is almost zero: no gradient tells the head where else to look. Divided by
# √d the scores have unit variance, the weights spread out, and the Jacobian is alive.

# %%
import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from attention_jax import functional as F  # noqa: E402

d = 256
q, k = jax.random.normal(jax.random.key(0), (2, 64, d))
scores = k @ q[0]                                            # one row of 64 scores, std ≈ √d
fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
traces = {}
for ax, (name, s) in zip(axes, [("raw q·k", scores), ("q·k / √d", scores / jnp.sqrt(d))]):
    J = jax.jacobian(F.masked_softmax)(s)                    # d softmax / d scores, [64, 64]
    w = F.masked_softmax(s)
    assert jnp.allclose(J, jnp.diag(w) - jnp.outer(w, w), atol=1e-6)
    traces[name] = float(jnp.trace(J))
    im = ax.imshow(J, cmap="RdBu_r", vmin=-0.25, vmax=0.25)
    ax.set(title=f"{name}\ntrace {traces[name]:.3f}, max weight {float(w.max()):.3f}", xlabel="score j",
           ylabel="weight i")
fig.colorbar(im, ax=axes, shrink=0.8)
plt.show()
assert traces["raw q·k"] < 0.1 < 0.9 < traces["q·k / √d"], traces

# %% [markdown]
# ## 3. The ablation ladder
#
# Ten models, each adding one part to the one before: no context, a uniform average, learned
# positions, a residual, one learned head, four heads, a feed-forward network, LayerNorm, two
# blocks. The same function the command line runs (`python -m experiments.ladder`) returns the
# rows, the chapter's claims checked per seed, the tables and the figures, in the dtype chosen
# above. On a GPU or TPU it trains the paper preset with 3 seeds and expects at least 7 of the
# 9 claims to hold: that run has never been made on a Colab GPU or TPU, so neither its time nor
# that count is measured. The cell first prints its estimate for this device (from the runs'
# FLOPs and the device's published peak: docs/performance.md), training arithmetic alone.

# %%
from experiments import estimates, ladder  # noqa: E402

PRESET, SEEDS = ("paper", 3) if EXPECTED != "cpu" else ("smoke", 1)
if EXPECTED != "cpu":
    print(estimates.for_device(jax.devices()[0].device_kind, estimates.NOTEBOOK))
result = ladder.EXPERIMENT(preset=PRESET, seeds=SEEDS, dtype=DTYPE, out="results", no_progress=True)
display(result)                                              # noqa: F821  (the table and the claims, once)
for fig in result.figures.values():
    display(fig)                                             # noqa: F821
assert [r["name"] for r in result.rows] == [row.name for row in ladder.ROWS]
assert all(1 < r["val_ppl"] < float("inf") and len(r["val_ppl_seeds"]) == SEEDS for r in result.rows)
assert len(result.claims) == 9
assert PRESET == "smoke" or sum(c["passed"] for c in result.claims) >= 7, result.markdown()

# %% [markdown]
# ## 4. Inside one trained block: where each head looks
#
# The ladder's one-block model (`layer_norm`) is reopened from its checkpoint (any row a table
# trained reopens so, training nothing: `EXPERIMENT.reopen`, docs/look_inside.md), run on a line
# of held-out text with `run_with_cache`, and each head's attention weights are drawn. The upper
# triangle is exactly zero: no position sees its future.

# %%
from attention_jax.data import load_tokens, resolve_corpus, train_val_split  # noqa: E402
from attention_jax.analysis.inspect import ablate, run_with_cache  # noqa: E402

trained = ladder.EXPERIMENT.reopen("layer_norm", preset=result.preset, seeds=SEEDS, dtype=DTYPE)
model, tokenizer = trained.model, trained.tokenizer                                # in eval mode
_, val = train_val_split(load_tokens(resolve_corpus(), verbose=False))
tokens = jnp.asarray(val[None, :24])
words = [tokenizer.decode([int(t)]) for t in tokens[0]]
logits, cache = run_with_cache(model, tokens, names="blocks.0.mixer.attention.weights")
w = cache["blocks.0.mixer.attention.weights"][0]                       # [heads, T, T]
fig, axes = plt.subplots(1, w.shape[0], figsize=(4.2 * w.shape[0], 4.2), layout="constrained")
for h, ax in enumerate(axes):
    im = ax.imshow(w[h], cmap="viridis", vmin=0, vmax=1)
    ax.set(title=f"head {h}", xlabel="key position", ylabel="query position")
    ax.set_xticks(range(len(words)), [repr(x)[1:-1] for x in words], rotation=90, fontsize=6)
fig.colorbar(im, ax=axes, shrink=0.8, label="attention weight")
plt.show()
assert jnp.all(jnp.triu(w, k=1) == 0)                        # the future gets exactly zero weight
from attention_jax.analysis import viewer  # noqa: E402

display(viewer.view(model, tokens[0], words, title="the one-block model"))   # noqa: F821  (hover, click)
assert jnp.allclose(w.sum(-1), 1.0, atol=1e-5)
with ablate(model, mixer=[0]):                               # and without attention, context is gone
    blind = model(tokens)
assert not jnp.allclose(blind, logits, atol=1e-3)
assert jnp.allclose(model(tokens), logits, atol=1e-5)        # the ablation put the model back

# %% [markdown]
# What the one-block model writes, one token at a time from its own next-token distribution
# (temperature 0.8; at the smoke preset, on a CPU, it has hardly trained).

# %%
from attention_jax.decoding.generate import generate  # noqa: E402

ids = generate(model, tokenizer.encode("ROMEO:").ids, 60, key=jax.random.key(0), temperature=0.8)
print(tokenizer.decode(ids.tolist()))
assert tokenizer.decode(ids.tolist()).startswith("ROMEO:") and len(ids) == len(tokenizer.encode("ROMEO:").ids) + 60

# %% [markdown]
# ## 5. Inside a tiny GPT: switch parts off and watch what breaks
#
# The lecture's 109,056-parameter character-level GPT, trained on a small world the project
# generates (40 people in 8 cities: "laba lives in nakmi."), then opened: parameters by
# formula, a forward pass from the raw weights, where each head looks, and what each part is
# worth (positions, each layer's attention and MLP, each head, the causal mask). On a CPU this
# notebook runs the `smoke` preset (a plumbing check: its figures mean nothing);
# `python -m experiments.inside_tiny_gpt` trains the `cpu` preset, about a minute on two cores,
# and a GPU/TPU runs the longer `paper` preset here.

# %%
from experiments import inside_tiny_gpt  # noqa: E402

tiny = inside_tiny_gpt.EXPERIMENT(preset="paper" if EXPECTED != "cpu" else "smoke", out="results", no_progress=True)
display(tiny)                                                # noqa: F821
display(tiny.figures["attention.png"])                       # noqa: F821
display(tiny.figures["ablations.png"])                       # noqa: F821
verdicts = {c["claim"]: c["passed"] for c in tiny.claims}
assert verdicts["attention puts exactly zero weight on the future"]
assert verdicts["parameters by formula = the framework's count, component by component"]

# %% [markdown]
# ## 6. A real model: GPT-2's own weights in these modules
#
# On a GPU or TPU runtime this loads GPT-2 small (124,439,808 parameters) from the Hugging
# Face hub into our `LanguageModel`, then runs the same probes on a sentence: each block's
# attention, every head switched off in turn, what each component writes into the residual
# stream, and a logit lens (each block's stream read through the final LayerNorm and the
# unembedding). On a CPU a tiny random GPT-2-shaped checkpoint stands in (the plumbing).

# %%
from experiments import gpt2  # noqa: E402

probe = gpt2.EXPERIMENT(preset="paper" if EXPECTED != "cpu" else "smoke", out="results")
display(probe)                                               # noqa: F821
display(probe.figures["probes.png"])                         # noqa: F821
assert all(c["passed"] for c in probe.claims)                # no weight on the future; the lens ends at the logits

# %% [markdown]
# ## 7. Past the chapter: induction heads, found causally
#
# A two-layer attention-only model learns to copy a repeated segment: a layer-2 *induction head*
# attends from each token of the second copy to the token after its earlier occurrence, reading
# keys a layer-1 *previous-token head* wrote. `python -m experiments.induction` trains one and
# two layers and watches the head form (on a CPU this runs its smoke preset: the plumbing).
# Then, on the trained model: which activations carry the copy (activation patching, one
# compiled sweep), each head's share of the logit (direct logit attribution), and how much the
# heads of layer 2 read layer 1 (K-composition against random matrices).

# %%
from attention_jax.analysis import circuits  # noqa: E402
from attention_jax.data.repeats import repeated_segments  # noqa: E402
from attention_jax.analysis.patching import activation_patch, logit_diff  # noqa: E402
from experiments import induction  # noqa: E402

heads = induction.EXPERIMENT(preset="paper" if EXPECTED != "cpu" else "smoke", out="results", no_progress=True)
display(heads)                                               # noqa: F821
display(heads.figures["induction.png"])                      # noqa: F821
model = induction.EXPERIMENT.reopen("two_layers", preset=heads.preset).model   # the two-layer model
b = repeated_segments(1, 0, batch=1, length=model.config.context, vocab=model.config.vocab_size, shortest=12, longest=32)
f, s = int(b["first"][0]), int(b["span"][0])
at = f + 2 * s - 2                                           # the second copy's last but one token
clean = b["x"][:, : at + 1]
corrupted = clean.copy()
corrupted[:, f + 1] = (clean[:, f + 1] + 1) % model.config.vocab_size    # the first copy's token to be copied
answer, wrong = int(clean[0, at - s + 1]), int(corrupted[0, f + 1])
metric = lambda logits: logit_diff(logits, answer, wrong)
sweep = activation_patch(model, clean, corrupted, metric, hook="z", by="head", into="corrupted")   # [layer, head]
print("activation patching of each head's output:\n", sweep.values.round(3))
display(viewer.PatchingView(sweep, title="each head's output patched"))          # noqa: F821
print("K-composition, layer 1 -> layer 2:\n", circuits.composition_scores(model, "K")[0, :, 1].round(3),
      "\nrandom baseline (mean, std):", circuits.composition_baseline(model.config.d_model, model.config.d_head_used))
assert sweep.values.shape == (2, model.config.n_heads)

# %% [markdown]
# Patching a head asks whether it matters; patching an *edge* asks which path carries it. Every
# edge of the residual graph (the embedding, each head and the logits as senders and receivers,
# a head's query, key and value inputs apart) is patched alone in one compiled program a block,
# and estimated from one backward pass (edge attribution); the top edges that reach the logits
# are the circuit, and its faithfulness is what it recovers alone, every other edge patched.

# %%
import numpy as np  # noqa: E402

from attention_jax.analysis.attribution import edge_attribution  # noqa: E402
from attention_jax.analysis.discovery import edge_patch  # noqa: E402
from attention_jax.analysis.faithfulness import faithfulness  # noqa: E402
from attention_jax.analysis.pruning import circuit  # noqa: E402

exact = edge_patch(model, clean, corrupted, metric)         # every edge alone, exactly
eap = edge_attribution(model, clean, corrupted, metric)     # every edge estimated: one forward, one backward
print(len(exact.graph.edges), "edges; the five that move the logit difference most:", exact.top(5))
print("edge attribution against exact patching, Pearson:", np.corrcoef(exact.effect, eap.effect)[0, 1].round(3))
print("the top 10 that reach the logits:", circuit(exact, k=10))
display(viewer.CircuitView(exact, circuit(exact, k=10), title="the top 10 edges that reach the logits"))  # noqa: F821
print("faithfulness of the top 5, 10, 20:", faithfulness(model, clean, corrupted, metric, exact, ks=[5, 10, 20]).round(2))
assert exact.effect.shape == (len(exact.graph.edges),)
