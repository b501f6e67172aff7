"""The PyTorch twin of the ladder's one-block model, as a PyTorch user writes it.

nanoGPT style: token + position nn.Embedding, a pre-norm block with nn.LayerNorm, causal
attention by F.scaled_dot_product_attention(is_causal=True), an exact-GELU MLP, ln_f and an
output nn.Linear with bias; torch.optim.AdamW (lr 1e-3; its default weight decay, 0.01, is
TrainConfig's) and cross-entropy. Run eagerly with torch's defaults (as many threads as cores).
Imported only by a torch contestant's process (experiments/_throughput_worker.py).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as TF


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d)   # ModelConfig.qkv_bias=False
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(C, dim=2))
        a = TF.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(a)
        return x + self.down(TF.gelu(self.up(self.ln2(x))))


class TwinLM(nn.Module):
    def __init__(self, vocab: int, context: int, d: int, heads: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.block, self.ln_f, self.head = Block(d, heads), nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln_f(self.block(x)))


def torch_contestant(batch: int, vocab: int, context: int, d: int = 128, heads: int = 4):
    """(step(i), None, info): one training step on the i-th of four fixed random batches."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = TwinLM(vocab, context, d, heads).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [torch.randint(0, vocab, (2, batch, context), device=dev) for _ in range(4)]

    def step(i):
        x, y = batches[i % 4]
        loss = TF.cross_entropy(model(x).view(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()   # waits for the device, as block_until_ready does for JAX

    return step, None, {"backend": dev, "threads": torch.get_num_threads()}
