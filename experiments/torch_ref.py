"""The PyTorch twin of our models and the weight copies between them: the test oracle, written once.

PyTorch is only the oracle, so this is the one module that imports it, and nothing in the
package imports this module at load time: tests `importorskip` it, `experiments.parity`
and the throughput benchmark import it when they run (`import_torch` says how to get
torch when it is missing).

The twin is written as a PyTorch user writes nanoGPT: token (+ position) nn.Embedding,
blocks of nn.LayerNorm, a fused q|k|v nn.Linear, `F.scaled_dot_product_attention(is_causal=
True)`, an exact-GELU MLP, ln_f and an output layer (or the token table, tied). torch's
Linear computes x·Wᵀ + b where our Dense computes x·K + b, so every copied kernel is a
transposed weight; our fused q|k|v columns and torch's in_proj rows share the layout
(q|k|v, heads, head width), so the transpose is the whole mapping.
"""
from __future__ import annotations

import numpy as np

from attention_jax.errors import UserError

try:
    import torch
    import torch.nn.functional as TF
except ImportError:   # the twin classes below need torch; say how to get it instead of a traceback
    torch = None


def import_torch():
    """torch, or one line saying how to install the oracle (the test extra pins a CPU wheel)."""
    try:
        import torch as found   # at call time, so a torch removed since (or in a test) is noticed
    except ImportError:
        from experiments.harness.oracles import INSTALL
        raise UserError(f"this compares against PyTorch, which is not installed; install the test extra: {INSTALL}") \
            from None
    return found


def as_torch(x) -> "torch.Tensor":
    return torch.from_numpy(np.array(x, np.float32))


def copy_dense(linear, dense) -> None:
    """ours -> torch. A torch bias we lack is set to 0."""
    linear.weight.data = as_torch(dense.kernel[...]).T.contiguous()
    if linear.bias is not None:
        linear.bias.data = torch.zeros_like(linear.bias) if dense.bias is None else as_torch(dense.bias[...])


def copy_norm(torch_ln, ln) -> None:
    torch_ln.weight.data = as_torch(ln.scale[...])
    if torch_ln.bias is not None:
        torch_ln.bias.data = torch.zeros_like(torch_ln.bias) if ln.bias is None else as_torch(ln.bias[...])


def torch_mha(mha):
    """torch.nn.MultiheadAttention carrying our `MultiHeadAttention`'s weights.

    torch has either all biases or none, so a bias we lack becomes zeros there.
    """
    import_torch()
    cfg = mha.config
    ref = torch.nn.MultiheadAttention(cfg.d_model, cfg.n_heads, bias=cfg.qkv_bias or cfg.bias, batch_first=True)
    ref.in_proj_weight.data = as_torch(mha.qkv.kernel[...]).T.contiguous()
    if ref.in_proj_bias is not None:
        ref.in_proj_bias.data = torch.zeros(3 * cfg.d_model) if mha.qkv.bias is None else as_torch(mha.qkv.bias[...])
    copy_dense(ref.out_proj, mha.out)
    return ref


def load_mha(ours, torch_mha_module) -> None:
    """torch -> ours: a `torch.nn.MultiheadAttention`'s weights into our `MultiHeadAttention`."""
    import jax.numpy as jnp
    as_jax = lambda t: jnp.asarray(t.detach().numpy())
    ours.qkv.kernel[...] = as_jax(torch_mha_module.in_proj_weight).T
    ours.out.kernel[...] = as_jax(torch_mha_module.out_proj.weight).T
    if ours.qkv.bias is not None:
        ours.qkv.bias[...] = as_jax(torch_mha_module.in_proj_bias)
    if ours.out.bias is not None:
        ours.out.bias[...] = as_jax(torch_mha_module.out_proj.bias)


if torch is not None:
    class TwinBlock(torch.nn.Module):
        """A pre-norm block: x + attn(LN(x)), then x + MLP(LN(x))."""

        def __init__(self, cfg):
            super().__init__()
            d, self.h = cfg.d_model, cfg.n_heads
            self.ln1 = torch.nn.LayerNorm(d, eps=cfg.ln_eps, bias=cfg.bias)
            self.ln2 = torch.nn.LayerNorm(d, eps=cfg.ln_eps, bias=cfg.bias)
            self.c_attn = torch.nn.Linear(d, 3 * d, bias=cfg.qkv_bias)
            self.c_proj = torch.nn.Linear(d, d, bias=cfg.bias)
            self.up, self.down = torch.nn.Linear(d, cfg.d_ff, bias=cfg.bias), torch.nn.Linear(cfg.d_ff, d, bias=cfg.bias)

        def attn(self, x):
            b, t, d = x.shape
            q, k, v = (y.view(b, t, self.h, d // self.h).transpose(1, 2) for y in self.c_attn(x).split(d, dim=2))
            y = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(b, t, d))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.down(TF.gelu(self.up(self.ln2(x))))

        def load(self, block):
            copy_norm(self.ln1, block.ln1), copy_norm(self.ln2, block.ln2)
            copy_dense(self.c_attn, block.mixer.qkv), copy_dense(self.c_proj, block.mixer.out)
            copy_dense(self.up, block.ffn.up), copy_dense(self.down, block.ffn.down)
            return self

    class TwinLM(torch.nn.Module):
        """Our `LanguageModel` for pre-norm configs with heads, learned positions and a feed-forward."""

        def __init__(self, cfg):
            super().__init__()
            if not (cfg.mixer == "heads" and cfg.positions == "learned" and cfg.feed_forward and cfg.layer_norm
                    and cfg.norm == "pre" and cfg.residual and cfg.scale):
                raise ValueError("the torch twin covers pre-norm blocks with heads, learned positions and an MLP")
            self.wte = torch.nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.wpe = torch.nn.Embedding(cfg.max_positions_used, cfg.d_model)
            self.blocks = torch.nn.ModuleList(TwinBlock(cfg) for _ in range(cfg.n_layers))
            self.ln_f = torch.nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps, bias=cfg.bias)
            self.lm_head = None if cfg.tie_embeddings else torch.nn.Linear(cfg.d_model, cfg.vocab_size,
                                                                              bias=cfg.bias)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            x = self.ln_f(x)
            return x @ self.wte.weight.T if self.lm_head is None else self.lm_head(x)

        def load(self, model):
            """Copy our model's weights in (ours -> torch)."""
            self.wte.weight.data = as_torch(model.token_embed.embedding[...])
            self.wpe.weight.data = as_torch(model.position_embed.embedding[...])
            for mine, theirs in zip(self.blocks, model.blocks):
                mine.load(theirs)
            copy_norm(self.ln_f, model.ln_f)
            if self.lm_head is not None:
                copy_dense(self.lm_head, model.lm_head)
            return self


def torch_contestant(batch: int, config, dtype: str = "float32"):
    """The throughput benchmark's torch side: (step(i), None, info), one AdamW training step on
    the i-th of four fixed random batches, eagerly, with torch's defaults (a thread per core;
    on a GPU, TF32 products allowed, as in our float32 step). dtype "bfloat16": the forward
    under `torch.autocast` (bfloat16 products, float32 weights and loss), torch's own mixed
    precision."""
    import_torch()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cuda":   # float32 products in TF32, as JAX's default precision takes them on a recent GPU
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    model = TwinLM(config).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)   # weight decay 0.01: TrainConfig's default
    vocab, context = config.vocab_size, config.context
    batches = [torch.randint(0, vocab, (2, batch, context), device=dev) for _ in range(4)]

    import contextlib
    low = dtype != "float32"
    autocast = (lambda: torch.autocast(dev, dtype=torch.bfloat16)) if low else contextlib.nullcontext

    def step(i):
        x, y = batches[i % 4]
        with autocast():
            logits = model(x)
        loss = TF.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()   # waits for the device, as block_until_ready does for JAX

    return step, None, {"backend": dev, "threads": torch.get_num_threads(),
                        "dtype": "bfloat16 autocast" if low else "float32"}
