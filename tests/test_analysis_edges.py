"""attention_jax.analysis.edges: the residual rewrite is the model with no edge patched, the other run with every
edge patched, and patching every edge into one receiver gives it the other run's input."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import ConfigError, ModelConfig
from attention_jax.analysis import edges
from attention_jax.model import LanguageModel

BASE = ModelConfig(vocab_size=23, context=8, d_model=16, n_heads=2, n_layers=2, mixer="heads")
CONFIGS = {
    "heads": {},
    "one_head": {"mixer": "head", "n_heads": 1},
    "average": {"mixer": "average", "n_heads": 1},
    "attention_only_rope": {"feed_forward": False, "positions": "rope"},
    "alibi_untied_biases": {"positions": "alibi", "tie_embeddings": False, "qkv_bias": True, "bias": True},
    "no_layer_norm_post": {"layer_norm": False, "norm": "post"},
    "post_norm": {"norm": "post"},
    "post_norm_rope": {"norm": "post", "positions": "rope", "n_layers": 3},
    "post_norm_one_head_biases": {"norm": "post", "mixer": "head", "n_heads": 1, "bias": True, "qkv_bias": True},
    "post_norm_average": {"norm": "post", "mixer": "average", "n_heads": 1},
}
CLEAN = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [3, 1, 4, 1, 5, 9, 2, 6]])
CORRUPTED = np.array([[1, 2, 9, 4, 5, 6, 7, 8], [3, 1, 4, 1, 7, 9, 2, 6]])


def _model(name):
    return LanguageModel(dataclasses.replace(BASE, **CONFIGS[name]), rngs=nnx.Rngs(1))


def test_the_graph_of_two_blocks_of_two_heads():
    g = edges.graph_of(_model("heads"))
    assert g.senders == ("embed", "0.h0", "0.h1", "0.ffn", "1.h0", "1.h1", "1.ffn")
    assert g.receivers[:6] == ("0.h0.q", "0.h1.q", "0.h0.k", "0.h1.k", "0.h0.v", "0.h1.v")
    assert g.receivers[6:] == ("0.ffn", "1.h0.q", "1.h1.q", "1.h0.k", "1.h1.k", "1.h0.v", "1.h1.v", "1.ffn", "logits")
    names = g.names()
    assert "0.h1->0.ffn" in names and "0.h0->0.h1.q" not in names and "0.ffn->1.h1.v" in names
    # embed to 6 q/k/v + 0.ffn; 4 senders to 6 q/k/v of block 1; 6 senders to 1.ffn; 7 to the logits
    assert len(names) == 6 + 3 + 4 * 6 + 6 + 7 == len(set(names))
    assert g.index("0.h1->0.ffn") == names.index("0.h1->0.ffn")
    np.testing.assert_array_equal(np.argwhere(g.mask(["embed->logits"])), [[0, g.receivers.index("logits")]])
    with pytest.raises(ConfigError, match="no edge '0.h0->0.h1.q'"):
        g.index("0.h0->0.h1.q")


@pytest.mark.parametrize("name", CONFIGS)
def test_no_edge_patched_is_the_model_and_every_edge_patched_is_the_other_run(name):
    model = _model(name)
    g = edges.graph_of(model)
    others = edges.outputs(model, jnp.asarray(CORRUPTED))
    none = np.zeros((len(g.senders), len(g.receivers)), np.float32)
    every = g.mask(range(len(g.edges)))
    scale = float(jnp.std(model(CLEAN)))
    np.testing.assert_allclose(edges.run(model, g, CLEAN, others, none), model(CLEAN), atol=2e-5 * scale)
    np.testing.assert_allclose(edges.run(model, g, CLEAN, others, every), model(CORRUPTED), atol=2e-5 * scale)


@pytest.mark.parametrize("name", ["heads", "alibi_untied_biases"])
def test_every_edge_into_the_logits_patched_gives_them_the_other_runs_stream(name):
    model = _model(name)
    g = edges.graph_of(model)
    into = [i for i, (s, r) in enumerate(g.edges) if g.receivers[r] == "logits"]
    others = edges.outputs(model, jnp.asarray(CORRUPTED))
    got = edges.run(model, g, CLEAN, others, g.mask(into))
    np.testing.assert_allclose(got, model(CORRUPTED), atol=1e-4)
    one = edges.run(model, g, CLEAN, others, g.mask(into[-1:]))          # the last FFN's term alone moves them
    assert float(jnp.abs(one - model(CLEAN)).max()) > 1e-3


def test_a_mask_in_between_is_a_share_of_each_run_and_differentiable():
    model = _model("heads")
    g = edges.graph_of(model)
    others = edges.outputs(model, jnp.asarray(CORRUPTED))
    f = lambda m: edges.run(model, g, CLEAN, others, m)[:, -1, 3].sum()
    grad = jax.grad(f)(jnp.zeros((len(g.senders), len(g.receivers))))
    s, r = np.asarray(g.edges).T
    off = np.ones(grad.shape, bool)
    off[s, r] = False
    assert float(jnp.abs(grad[off]).max()) == 0.0 and float(jnp.abs(grad[s, r]).max()) > 0


def test_a_model_whose_inputs_are_not_sums_is_refused():
    with pytest.raises(ConfigError, match="no residual stream"):
        edges.graph_of(LanguageModel(dataclasses.replace(BASE, residual=False), rngs=nnx.Rngs(0)))


def test_the_graph_of_a_post_norm_model_has_its_layer_norms_as_nodes():
    g = edges.graph_of(_model("post_norm"))
    assert g.senders == ("embed", "0.h0", "0.h1", "0.ln1", "0.ffn", "0.ln2", "1.h0", "1.h1", "1.ln1", "1.ffn",
                         "1.ln2")
    names = g.names()
    assert [n for n in names if n.endswith("->0.ln1")] == ["embed->0.ln1", "0.h0->0.ln1", "0.h1->0.ln1"]
    assert [n for n in names if n.startswith("0.ln2->")] == [f"0.ln2->1.h{h}.{c}" for c in "qkv" for h in (0, 1)] \
        + ["0.ln2->1.ln1"]
    assert "embed->1.h0.q" not in names and "1.ln2->logits" in names and "1.ffn->logits" not in names
    assert len(names) == 2 * (6 + 3 + 1 + 2) + 1


def test_a_mask_of_another_graph_is_refused():
    model = _model("heads")
    g = edges.graph_of(model)
    others = edges.outputs(model, jnp.asarray(CORRUPTED))
    with pytest.raises(ConfigError, match="7 senders and 15 receivers"):
        edges.run(model, g, CLEAN, others, np.zeros((3, 4), np.float32))


@pytest.mark.parametrize("name", CONFIGS)
def test_one_edge_patched_alone_equals_its_mask_from_the_first_block_or_its_own(name):
    model = _model(name)
    g = edges.graph_of(model)
    others, mine = edges.outputs(model, jnp.asarray(CORRUPTED)), edges.record(model, jnp.asarray(CLEAN))
    scale = float(jnp.std(model(CLEAN)))
    for e in (0, len(g.edges) // 2, len(g.edges) - 1):      # into block 0, a middle receiver, the logits
        s, r = g.edges[e]
        want = edges.run(model, g, CLEAN, others, g.mask([e]))
        start = edges.block_of(g.receivers[r], model.config.n_layers)
        for begin in {0, start}:
            got = edges.run_edge(model, g, CLEAN, others, jnp.asarray([s, r]), start=begin, mine=mine)
            np.testing.assert_allclose(got, want, atol=2e-5 * scale, err_msg=f"{g.names()[e]}, from block {begin}")


def _by_hooks(model, edge: str, clean, corrupted):
    """Logits of `clean` with one post-norm edge patched, written with the model's own hook points: the
    receiver's input changed by the other run's term of that one sender, nothing else."""
    from attention_jax.analysis.inspect import patched, run_with_cache
    _, mine = run_with_cache(model, clean)
    _, other = run_with_cache(model, corrupted)
    sender, receiver = edge.split("->")
    node, role = edges.receiver_node(receiver)
    i = receiver.split(".")[0]

    def at_head(name, h):                    # [B, H, T, D]: head h's from the other run
        return {name: lambda v: v.at[:, h].set(other[name][:, h])}

    def plus(name, was):                     # the sub-layer's output plus the stream's change (its residual term)
        return {name: lambda v: v + other[was] - mine[was]}
    if receiver == "logits":
        patch = {"final": lambda v: other["final"]}
    elif role is not None:                   # a head's query, key or value input: that head's q, k or v
        patch = at_head(f"blocks.{i}.mixer.{role}", int(node.split(".h")[1]))
    elif receiver.endswith(".ln1"):
        patch = (at_head(f"blocks.{i}.mixer.z", int(sender.split(".h")[1])) if ".h" in sender else
                 plus(f"blocks.{i}.mixer_out", f"blocks.{i}.resid_pre"))
    elif receiver.endswith(".ffn") or sender.endswith(".ffn"):    # the FFN reads the stream alone, writes to ln2 alone
        patch = {f"blocks.{i}.ffn_out": lambda v: other[f"blocks.{i}.ffn_out"]}
    else:
        patch = plus(f"blocks.{i}.ffn_out", f"blocks.{i}.resid_mid")
    with patched(model, patch):
        return model(clean)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["post_norm", "post_norm_rope"])
def test_every_post_norm_edge_patched_equals_its_patch_by_the_models_own_hooks(name):
    """An oracle written apart from the rewrite: each edge's logits equal the same change made on the model
    as built through its hook points (a head's q/k/v, z, the sub-layers' outputs, the final stream)."""
    model = _model(name)
    g = edges.graph_of(model)
    others, mine = edges.outputs(model, jnp.asarray(CORRUPTED)), edges.record(model, jnp.asarray(CLEAN))
    scale = float(jnp.std(model(CLEAN)))
    moved = 0
    for e, edge in enumerate(g.names()):
        want = _by_hooks(model, edge, jnp.asarray(CLEAN), jnp.asarray(CORRUPTED))
        start = edges.block_of(g.receivers[g.edges[e][1]], model.config.n_layers)
        for got in (edges.run(model, g, CLEAN, others, g.mask([e])),          # the mask, and the one edge alone
                    edges.run_edge(model, g, CLEAN, others, jnp.asarray(g.edges[e]), start=start, mine=mine)):
            np.testing.assert_allclose(got, want, atol=2e-5 * scale, err_msg=edge)
        moved += float(jnp.abs(want - model(CLEAN)).max()) > 1e-3 * scale
    assert moved > len(g.edges) // 2                  # the patches change the logits: the comparison means something


def test_a_mask_as_a_list_is_read_and_outputs_of_another_batch_are_refused():
    model = _model("heads")
    g = edges.graph_of(model)
    others = edges.outputs(model, jnp.asarray(CORRUPTED))
    mask = g.mask([3])
    np.testing.assert_allclose(edges.run(model, g, CLEAN, others, mask.tolist()), edges.run(model, g, CLEAN, others, mask))
    with pytest.raises(ConfigError, match=r"others is \(7, 1, 8, 16\): it must be every sender's output"):
        edges.run(model, g, CLEAN, others[:, :1], mask)
