"""TransformerLens as the reference of patching and circuits: a random GPT-2 written by transformers,
read by our loader, and TransformerLens' TransformerBridge over the very same model.

Used by the tests (tests/test_analysis_patching.py, tests/test_analysis_circuits.py, tests/test_analysis_discovery.py) and by
`experiments.patching`, never by the library. transformers, torch and transformer-lens come with the test extra.
"""
from __future__ import annotations

import copy
import logging
import pathlib


def random_gpt2(folder: pathlib.Path, *, seed: int = 0, std: float = 0.3, **shape):
    """A random GPT-2 (3 layers, 4 heads, width 32, a vocabulary of 101 by default) whose weights are
    big enough for its heads to look somewhere (N(0, std²), LayerNorm gains near 1), written by
    transformers into `folder` and read back by our loader: (our LanguageModel, the transformers model)."""
    import torch
    import transformers
    from attention_jax import pretrained
    dims = dict(vocab_size=101, n_positions=16, n_embd=32, n_layer=3, n_head=4) | shape
    config = transformers.GPT2Config(**dims, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                     eos_token_id=0, attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "ln" in name and name.endswith("weight")
                    else std * torch.randn_like(p))
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    model.config._name_or_path = str(folder)          # where TransformerLens' bridge finds its config
    return pretrained.load(folder), model


def bridge(hf_model, *, compatible: bool = False):
    """TransformerLens 4's TransformerBridge over that very model (its raw weights; `compatible`: its
    HookedTransformer numerics, LayerNorms folded and writing weights centred, on a copy)."""
    from transformer_lens import TransformerBridge
    logging.getLogger("transformer_lens").setLevel(logging.ERROR)
    model = copy.deepcopy(hf_model) if compatible else hf_model     # folding rewrites the weights it is given
    made = TransformerBridge.boot_transformers(hf_model.config._name_or_path, hf_model=model, device="cpu")
    if compatible:
        made.enable_compatibility_mode()
    return made


def split_inputs(bridge):
    """The bridge with the hook points edge patching reads: each head's q, k and v inputs apart, each head's
    result (without the output bias) and each MLP's input. Its logits do not change."""
    bridge.set_use_split_qkv_input(True)
    bridge.set_use_attn_result(True)
    bridge.set_use_hook_mlp_in(True)
    return bridge


def _sender(name: str):
    """Our sender's name ("embed", "1.h2", "1.ffn") -> (its hook point, its head or None)."""
    if name == "embed":
        return "blocks.0.hook_resid_pre", None
    layer, part = name.split(".")
    return (f"blocks.{layer}.attn.hook_result", int(part[1:])) if part.startswith("h") else \
        (f"blocks.{layer}.hook_mlp_out", None)


def _receiver(name: str, n_layers: int):
    """Our receiver's name ("1.h2.k", "1.ffn", "logits") -> (its hook point, its head or None)."""
    if name == "logits":
        return f"blocks.{n_layers - 1}.hook_resid_post", None
    layer, *rest = name.split(".")
    if rest[0] == "ffn":
        return f"blocks.{layer}.hook_mlp_in", None
    return f"blocks.{layer}.attn.hook_{rest[1]}_input", int(rest[0][1:])


def edge_patch_loop(bridge, clean, corrupted, edges, metric):
    """ACDC's edge patching as a plain loop of TransformerLens forwards: for each set of edges (pairs of our
    sender and receiver names), the clean run with each receiver's input given, for each of its edges,
    the sender's corrupted output in place of its output in this run; metric(logits) for each set.
    `bridge` from `split_inputs`; clean, corrupted: torch token ids [B, T]."""
    import torch
    pick = lambda x, head: x if head is None else x[:, :, head]
    kept = {}
    with torch.no_grad():
        bridge.run_with_hooks(corrupted, fwd_hooks=[(n, (lambda n: lambda t, hook: kept.__setitem__(n, t.clone()))(n))
                                                    for n in {_sender(s)[0] for patch in edges for s, _ in patch}])
        values = []
        for patch in edges:
            current, hooks = {}, []
            for name in {_sender(s)[0] for s, _ in patch}:
                hooks.append((name, (lambda name: lambda t, hook: current.__setitem__(name, t))(name)))
            for receiver in {r for _, r in patch}:
                point, at = _receiver(receiver, bridge.cfg.n_layers)
                ins = [_sender(s) for s, r in patch if r == receiver]

                def add(t, hook, at=at, ins=ins):
                    delta = sum(pick(kept[n], h) - pick(current[n], h) for n, h in ins)
                    t = t.clone()
                    if at is None:
                        t += delta
                    else:
                        t[:, :, at] += delta
                    return t
                hooks.append((point, add))
            values.append(float(metric(bridge.run_with_hooks(clean, fwd_hooks=hooks))))
    return values
