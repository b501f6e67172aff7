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


def eap_ig_loop(bridge, clean, corrupted, edges, metric, *, steps: int, over: str = "inputs"):
    """EAP-IG as Hanna et al.'s code computes it, on TransformerLens' hooks with torch's autograd: for each
    edge (our sender and receiver names), (the sender's corrupted output - its clean one) times the metric's
    gradient at the receiver's input, averaged over the runs of the clean text whose input (`over="inputs"`,
    k/steps for k = 0 .. steps - 1) or each node's output in turn (`"activations"`: the input, every
    attention's and MLP's output; k = 1 .. steps) is moved from corrupted to clean. `bridge` from
    `split_inputs`; one value an edge."""
    import torch
    pick = lambda x, head: x if head is None else x[:, :, head]
    n = bridge.cfg.n_layers
    moved = ["blocks.0.hook_resid_pre"] + ([] if over == "inputs" else
                                           [f"blocks.{i}.{p}" for i in range(n) for p in ("hook_attn_out", "hook_mlp_out")])
    wanted = {_sender(s)[0] for s, _ in edges} | set(moved)

    def run(tokens):
        kept = {}
        with torch.no_grad():
            bridge.run_with_hooks(tokens, fwd_hooks=[(name, (lambda name: lambda t, hook: kept.__setitem__(
                name, t.clone()))(name)) for name in wanted])
        return kept
    mine, theirs = run(clean), run(corrupted)
    bridge.requires_grad_(True)              # every activation on the graph, so each receiver's input keeps its grad
    points = {_receiver(r, n)[0] for _, r in edges}
    grads, runs = {p: 0.0 for p in points}, 0
    for node in moved:
        for k in (range(steps) if over == "inputs" else range(1, steps + 1)):
            alpha, seen = k / steps, {}

            def keep(point):                     # by the name asked for: a hook's own may be an alias's
                def hook_fn(t, hook):
                    t = t.clone()                    # the bridge's MLP input is the stream itself: this copy is its
                    t.retain_grad()                  # input alone, as its additive patch is (edge_patch_loop)
                    seen[point] = t
                    return t
                return hook_fn
            move = lambda t, hook, node=node, alpha=alpha: (alpha * mine[node] + (1 - alpha) * theirs[node]).requires_grad_()
            hooks = [(node, move)] + [(p, keep(p)) for p in points]
            metric(bridge.run_with_hooks(clean, fwd_hooks=hooks)).backward()
            # A receiver whose every path runs through the moved node has no gradient: zero, as the node is fixed.
            grads = {p: grads[p] + (0.0 if seen[p].grad is None else seen[p].grad.detach()) for p in points}
            runs += 1
    scores = []
    for s, r in edges:
        (out, head), (point, at) = _sender(s), _receiver(r, n)
        scores.append(float((pick(theirs[out], head) - pick(mine[out], head)).mul(pick(grads[point], at)).sum() / runs))
    return scores


def edge_patch_batched(bridge, clean, corrupted, edges, metric, *, copies: int = 64):
    """Every edge of `edges` (pairs of our sender and receiver names) patched alone, as a practised user batches
    it: `copies` patched copies of the clean batch in one forward, each adding its one edge's corrupted-minus-
    clean sender output (the same in every copy's run, as nothing before it is patched) to its receiver's input,
    one tensor added a hook point; metric(logits) for each copy. `bridge` from `split_inputs`; clean,
    corrupted: torch token ids [B, T]."""
    import torch
    pick = lambda x, head: x if head is None else x[:, :, head]
    n, B = bridge.cfg.n_layers, clean.shape[0]
    outs = {_sender(s)[0] for s, _ in edges}
    with torch.no_grad():
        kept = [{}, {}]
        for store, tokens in zip(kept, (clean, corrupted)):
            bridge.run_with_hooks(tokens, fwd_hooks=[(o, (lambda o, store: lambda t, hook: store.__setitem__(
                o, t.clone()))(o, store)) for o in outs])
        delta = {s: pick(kept[1][_sender(s)[0]], _sender(s)[1]) - pick(kept[0][_sender(s)[0]], _sender(s)[1])
                 for s, _ in edges}
        shapes = {}                          # each receiver point's activation shape, from one clean run
        bridge.run_with_hooks(clean, fwd_hooks=[(_receiver(r, n)[0], (lambda p: lambda t, hook: shapes.__setitem__(
            p, t.shape[1:]))(_receiver(r, n)[0])) for _, r in edges])
        values = []
        for start in range(0, len(edges), copies):
            chunk, added = edges[start:start + copies], {}
            for j, (s, r) in enumerate(chunk):
                point, at = _receiver(r, n)
                d = added.setdefault(point, torch.zeros((len(chunk) * B, *shapes[point])))
                (d[j * B:(j + 1) * B] if at is None else d[j * B:(j + 1) * B, :, at]).add_(delta[s])
            hooks = [(p, (lambda d: lambda t, hook: t + d)(d)) for p, d in added.items()]
            logits = bridge.run_with_hooks(clean.repeat(len(chunk), 1), fwd_hooks=hooks)
            values += [float(metric(logits[j * B:(j + 1) * B])) for j in range(len(chunk))]
    return values
