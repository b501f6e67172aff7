"""attention_jax.analysis.edge_twins: with the twins in and nothing patched, the model computes what it
computes without them, bit for bit; what they record is the model's own; a live hook patch stays in
force; and the caller's model is never changed."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import ModelConfig
from attention_jax.analysis import edge_twins, edges
from attention_jax.analysis.inspect import ablate, patched, run_with_cache
from attention_jax.model import LanguageModel
from attention_jax.swap import swap, twins

BASE = ModelConfig(vocab_size=23, context=8, d_model=16, n_heads=2, n_layers=2, mixer="heads", bias=True,
                   qkv_bias=True, tie_embeddings=False)
CONFIGS = {"pre": {}, "post": {"norm": "post"}, "one_head": {"mixer": "head", "n_heads": 1},
           "average": {"mixer": "average", "n_heads": 1}, "rope": {"positions": "rope"}}
CLEAN = jnp.asarray([[1, 2, 3, 4, 5, 6, 7, 8], [3, 1, 4, 1, 5, 9, 2, 6]])
CORRUPTED = jnp.asarray([[1, 2, 9, 4, 5, 6, 7, 8], [3, 1, 4, 1, 7, 9, 2, 6]])


def _model(name):
    return LanguageModel(dataclasses.replace(BASE, **CONFIGS[name]), rngs=nnx.Rngs(2))


@pytest.mark.parametrize("name", CONFIGS)
def test_recording_computes_the_model_bit_for_bit_and_keeps_its_own_streams(name):
    model = _model(name)
    graph = edges.graph_of(model)
    copy = nnx.merge(*nnx.split(model))
    rule = edge_twins.Record()
    parts = twins(copy, edge_twins.TWINS, places=dict(graph.places), rule=rule, within=copy)
    assert parts, "the graph names no place of the model"
    swap(copy, parts)
    np.testing.assert_array_equal(copy(CLEAN), model(CLEAN))
    assert sorted(rule.outs) == list(range(len(graph.senders)))
    _, cache = run_with_cache(model, CLEAN, ["blocks.*.resid_pre", "final"])
    for i in range(model.config.n_layers):
        np.testing.assert_array_equal(rule.streams[i], cache[f"blocks.{i}.resid_pre"])
    np.testing.assert_array_equal(rule.streams[model.config.n_layers], cache["final"])


def test_pre_norm_senders_add_up_to_the_stream_with_the_output_biases():
    model = _model("pre")
    rec = edges.record(model, CLEAN)
    biases = sum(b.mixer.out.bias[...] for b in model.blocks)
    np.testing.assert_allclose(rec.senders.sum(0) + biases, rec.streams[-1], atol=1e-5)


@pytest.mark.parametrize("name", ["pre", "post"])
def test_a_live_hook_patch_stays_in_force_through_every_edge_function(name):
    """Discovery reads the model as it is: inside a patch (a head zeroed, a stream mean-ablated), no edge
    patched is the patched model, and the senders recorded are the patched model's."""
    model = _model(name)
    graph = edges.graph_of(model)
    none = graph.mask([])
    plain = edges.run(model, graph, CLEAN, edges.outputs(model, CORRUPTED), none)
    mean = lambda v: jnp.broadcast_to(v.mean(axis=1, keepdims=True), v.shape)
    for context in (ablate(model, heads={0: [1]}), patched(model, {"blocks.1.resid_mid": mean})):
        with context:
            want = model(CLEAN)
            others = edges.outputs(model, CORRUPTED)
            got = edges.run(model, graph, CLEAN, others, none)
            edge = graph.edges[len(graph.edges) // 2]
            one = edges.run_edge(model, graph, CLEAN, others, jnp.asarray(edge))
            masked = edges.run(model, graph, CLEAN, others, graph.mask([len(graph.edges) // 2]))
        np.testing.assert_allclose(got, want, atol=1e-5)
        np.testing.assert_allclose(one, masked, atol=1e-5)
        assert float(jnp.abs(want - plain).max()) > 1e-3       # the patch changes the logits: the check means something


def test_the_callers_model_is_never_changed():
    model = _model("pre")
    before = {".".join(map(str, p)): type(m) for p, m in nnx.iter_modules(model)}
    graph = edges.graph_of(model)
    others = edges.outputs(model, CORRUPTED)
    edges.run(model, graph, CLEAN, others, graph.mask([0, 1]))
    edges.run_edge(model, graph, CLEAN, others, jnp.asarray(graph.edges[3]))
    assert {".".join(map(str, p)): type(m) for p, m in nnx.iter_modules(model)} == before
