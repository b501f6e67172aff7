"""TransformerLens as the reference of patching and circuits: a random GPT-2 written by transformers,
read by our loader, and TransformerLens' TransformerBridge over the very same model.

Used by the tests (tests/test_patching.py, tests/test_circuits.py) and by `experiments.patching`,
never by the library. transformers, torch and transformer-lens come with the test extra.
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
