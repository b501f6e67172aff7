"""Our attention against PyTorch's, with the weights copied over from PyTorch itself.

`python -m experiments.parity` builds a causal `torch.nn.MultiheadAttention`, copies its
weights into `attention_jax.model.MultiHeadAttention`, and compares the outputs; it also
rebuilds the same layer around `F.scaled_dot_product_attention`, and checks our
functional `F.attention` (and its weights) on the very same q, k, v. The book reports
max |diff| 1.8e-7 at a mean output magnitude of 0.159: the same arithmetic in another
order, in float32. The book does not give its shapes; we use batch 2, 64 tokens, width
128 and 4 heads (the chapter's model width and head count).
"""
from __future__ import annotations

from attention_jax.config import ModelConfig
from experiments.harness import report
from experiments.harness.experiment import Experiment, Result
from experiments.harness.oracles import NOT_MEASURED, absent, missing, note

NAME = "parity"
PRESETS = {
    "smoke": dict(batch=1, tokens=16, d_model=32, n_heads=4, seed=0),
    "cpu": dict(batch=2, tokens=64, d_model=128, n_heads=4, seed=0),
    "paper": dict(batch=2, tokens=64, d_model=128, n_heads=4, seed=0),
}
TOLERANCE = 1e-5      # float32 reordering noise is ~1e-7; a wrong layout or mask is ~1e-1


def run(ctx) -> Result:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from attention_jax import functional as F
    from experiments import torch_ref   # torch is the oracle: imported only here
    from attention_jax.model import MultiHeadAttention
    p = ctx.settings
    gone = missing("torch")
    if gone:                     # the whole table is a comparison with PyTorch: none measured, none checked
        return unmeasured(gone)
    torch = torch_ref.import_torch()
    import torch.nn.functional as TF

    B, T, D, H = p["batch"], p["tokens"], p["d_model"], p["n_heads"]
    torch.manual_seed(p["seed"])
    mha = torch.nn.MultiheadAttention(D, H, bias=True, batch_first=True)
    x = torch.randn(B, T, D)
    with torch.no_grad():
        # torch starts both biases at zero; random ones make their mapping part of the test.
        mha.in_proj_bias.normal_(0.0, 0.1)
        mha.out_proj.bias.normal_(0.0, 0.1)
        future = ~torch.tril(torch.ones(T, T, dtype=torch.bool))    # torch's bool mask: True = may not attend
        by_module, torch_weights = mha(x, x, x, attn_mask=future, need_weights=True, average_attn_weights=False)
        q, k, v = TF.linear(x, mha.in_proj_weight, mha.in_proj_bias).split(D, dim=-1)
        split_heads = lambda t: t.reshape(B, T, H, D // H).transpose(1, 2)       # [B, H, T, D/H]
        mixed = TF.scaled_dot_product_attention(split_heads(q), split_heads(k), split_heads(v), is_causal=True)
        by_sdpa = TF.linear(mixed.transpose(1, 2).reshape(B, T, D), mha.out_proj.weight, mha.out_proj.bias)

    config = ModelConfig(vocab_size=1, context=T, d_model=D, n_heads=H, mixer="heads", qkv_bias=True)
    ours = MultiHeadAttention(config, rngs=nnx.Rngs(p["seed"]))
    torch_ref.load_mha(ours, mha)
    as_jax = lambda t: jnp.asarray(t.detach().numpy())
    # Full float32 matmuls: GPUs and TPUs would otherwise use TF32 / bfloat16 passes.
    with jax.default_matmul_precision("highest"):
        out = ours(as_jax(x))
        f_out, f_weights = F.attention(*(as_jax(split_heads(t)) for t in (q, k, v)),
                                       mask=F.causal_mask(T), return_weights=True)

    def compare(name, a, b, book=None, book_magnitude=None):
        a, b = jnp.asarray(a), as_jax(b)
        return dict(comparison=name, diff=float(jnp.max(jnp.abs(a - b))), magnitude=float(jnp.mean(jnp.abs(b))),
                    book=book, book_magnitude=book_magnitude)

    rows = [compare("MultiHeadAttention vs nn.MultiheadAttention", out, by_module, 1.79e-7, 0.159),
            compare("MultiHeadAttention vs F.scaled_dot_product_attention", out, by_sdpa, 1.79e-7, 0.159),
            compare("F.attention vs F.scaled_dot_product_attention (same q, k, v)", f_out, mixed),
            compare("F.attention weights vs nn.MultiheadAttention weights", f_weights, torch_weights)]
    table = report.format_table([("comparison", "comparison", "s"), ("diff", "max |diff|", ".3g"),
                                 ("book", "book", ".3g"), ("magnitude", "mean |torch output|", ".3f"),
                                 ("book_magnitude", "book", ".3f")], rows)
    print(f"batch {B}, {T} tokens, d_model {D}, {H} heads, causal mask, float32, torch {torch.__version__}")
    claims = [report.claim(f"{r['comparison']}: max |diff| < {TOLERANCE:g}", r["diff"] < TOLERANCE,
                           f"{r['diff']:.3g} at mean magnitude {r['magnitude']:.3f}") for r in rows]
    book = [report.book(f"max |diff|: {r['comparison']}", r["book"], r["diff"], ".3g") for r in rows if r["book"]]
    return Result(rows=rows, claims=claims, tables={"Parity with PyTorch": table}, book=book,
                  config={**p, "model": config.to_dict(), "torch": torch.__version__})


COMPARISONS = ("MultiHeadAttention vs nn.MultiheadAttention", "MultiHeadAttention vs F.scaled_dot_product_attention",
               "F.attention vs F.scaled_dot_product_attention (same q, k, v)",
               "F.attention weights vs nn.MultiheadAttention weights")


def unmeasured(gone) -> Result:
    """Without PyTorch: one line, every comparison "not measured", its claim not checked."""
    print(note("every comparison with PyTorch", gone), flush=True)
    rows = [dict(comparison=c, diff=NOT_MEASURED) for c in COMPARISONS]
    table = report.format_table([("comparison", "comparison", "s"), ("diff", "max |diff|", "")], rows)
    claims = [report.unchecked(report.claim(f"{c}: max |diff| < {TOLERANCE:g}", False, NOT_MEASURED), absent(gone))
              for c in COMPARISONS]
    return Result(rows=rows, claims=claims, tables={"Parity with PyTorch": table})


EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run, smoke_decides=True)   # exact claims: decided at any budget
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
