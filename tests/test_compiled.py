"""tracr's compiled models in our modules: tracr's own numbers (residual stream, attention scores,
readout) to float rounding, the RASP program's answers, and the true circuit, by hand and by
patching every other edge. tracr is the oracle: without it (the test extra's) the tests that
compile skip, naming it. A compile costs seconds, so the fast tier compiles one program
(pair_balance: two heads in a layer, an empty attention half, a numerical output); the rest are
slow.
"""
import ast
import functools
import pathlib

import numpy as np
import pytest

from attention_jax import compiled
from attention_jax.analysis import edges
from attention_jax.analysis.inspect import run_with_cache
from attention_jax.errors import ConfigError, DataError

from helpers import oracle

BOS = "compiler_bos"


def _programs():
    """name -> (program, vocabulary, max_seq_len, inputs): the first two inputs of one length (the
    clean and corrupted texts of the patching test)."""
    from tracr.compiler import lib
    from tracr.rasp import rasp
    return {
        "pair_balance": (lib.make_pair_balance(rasp.tokens, "(", ")"), {"(", ")", "a"}, 5,
                         [list("(()a"), list(")a(("), list("()"), list("a(())")]),
        "reverse": (lib.make_reverse(rasp.tokens), {1, 2, 3}, 5,
                    [[1, 2, 3], [3, 3, 1], [2, 1, 3, 3, 1], [2]]),
        "frac_prevs": (lib.make_frac_prevs(rasp.tokens == "x"), {"a", "b", "x"}, 5,
                       [list("xaxx"), list("bxab"), list("x"), list("abxax")]),
        "hist": (lib.make_hist(), {"a", "b", "c"}, 5,
                 [list("abac"), list("cccb"), list("b"), list("aabca")]),
        "sort_unique": (lib.make_sort_unique(rasp.tokens, rasp.tokens), {1, 2, 3, 4, 5}, 5,
                        [[3, 1, 4], [5, 2, 1], [2, 5, 4, 1, 3], [4]]),
        "shuffle_dyck": (lib.make_shuffle_dyck(["()"]), {"(", ")"}, 4,
                         [list("()()"), list(")(()"), list("(())"), list("())")]),
    }


@functools.cache
def _compiled(name):
    program, vocab, max_seq_len, inputs = _programs()[name]
    return program, compiled.compile_rasp(program, vocab, max_seq_len), inputs


@pytest.fixture(scope="module")
def case():
    """(program, Compiled, inputs, model, encode, decode) by name; the test skips without tracr."""
    oracle("tracr"), oracle("haiku")
    return lambda name: (*_compiled(name), *compiled.from_tracr(_compiled(name)[1]))


SLOW = ("reverse", "frac_prevs", "hist", "sort_unique", "shuffle_dyck")
NAMES = ["pair_balance"] + [pytest.param(n, marks=pytest.mark.slow) for n in SLOW]


@pytest.mark.parametrize("name", NAMES)
def test_a_loaded_model_computes_tracr_s_numbers_and_the_program_s_answers(case, name):
    """Per input: each half-layer's residual stream and each layer's attention scores equal tracr's,
    the readout tracr's (the output's value, or its one number), decode is tracr's decoded and,
    past BOS, the RASP program's own answer."""
    from tracr.rasp import rasp
    program, c, inputs, model, encode, decode = case(name)
    cfg = model.config
    assert (cfg.causal, cfg.activation, cfg.layer_norm, cfg.bias) == (False, "relu", False, False)
    for values in inputs:
        theirs = c.assembled.apply([BOS, *values])
        logits, cache = run_with_cache(model, encode(values))
        layers = range(cfg.n_layers)
        ours = [cache[f"blocks.{i}.{at}"] for i in layers for at in ("resid_mid", "resid_post")]
        np.testing.assert_allclose(np.stack(ours), np.stack(theirs.residuals), atol=1e-4)
        scores = np.stack([cache[f"blocks.{i}.mixer.attention.scores"] for i in layers])
        np.testing.assert_allclose(scores, np.stack(theirs.attn_logits), atol=1e-3)   # up to ~40
        decoded = decode(logits)[0]
        assert decoded[:1] == [BOS] and len(decoded) == len(values) + 1
        if rasp.is_numerical(program):
            np.testing.assert_allclose(np.asarray(logits)[0, :, 0], theirs.unembedded[0], atol=1e-4)
            np.testing.assert_allclose(decoded[1:], theirs.decoded[1:], atol=1e-4)
            np.testing.assert_allclose(decoded[1:], rasp.evaluate(program, values), atol=1e-4)
        else:
            np.testing.assert_array_equal(np.asarray(logits)[0].argmax(-1), theirs.unembedded[0])
            assert decoded == theirs.decoded and decoded[1:] == rasp.evaluate(program, values)
    batch = [v for v in inputs if len(v) == len(inputs[0])]
    assert decode(model(encode(batch))) == [decode(model(encode(v)))[0] for v in batch]


@pytest.mark.parametrize("name", NAMES)
def test_patching_every_edge_but_the_true_ones_changes_nothing(case, name):
    """Every edge outside `true_edges` takes its sender's output on another input: the logits stay
    the clean input's (no true edge is missing); every edge patched gives the other input's."""
    _, c, inputs, model, encode, _ = case(name)
    clean, corrupted = encode(inputs[0]), encode(inputs[1])
    graph, true = edges.graph_of(model), compiled.true_edges(c)
    assert true <= set(graph.names()) and true
    others = edges.outputs(model, corrupted)
    rest = graph.mask([e for e in graph.names() if e not in true])
    patched = edges.run(model, graph, clean, others, rest)
    np.testing.assert_allclose(patched, model(clean), atol=1e-4)
    everything = edges.run(model, graph, clean, others, graph.mask(graph.names()))
    np.testing.assert_allclose(everything, model(corrupted), atol=1e-4)
    assert float(np.abs(np.asarray(model(clean)) - np.asarray(model(corrupted))).max()) > 0.1


def test_pair_balance_s_true_edges_by_hand(case):
    """make_pair_balance(tokens, "(", ")"): layer 0's MLP maps tokens to is-"(" and is-")" (two
    maps, one MLP); layer 1's two heads average each over the positions up to the query's (query:
    indices and "one", the BOS's pull; key: indices and tokens:BOS; value: its map); layer 1's MLP
    takes their difference, which the logits read. Layer 0's attention is empty: no edge."""
    _, c, _, model, _, _ = case("pair_balance")
    heads = [f"embed->1.h{h}.{q}" for h in (0, 1) for q in "qk"]
    assert compiled.true_edges(c) == {"embed->0.ffn", "0.ffn->1.h0.v", "0.ffn->1.h1.v", *heads,
                                      "1.h0->1.ffn", "1.h1->1.ffn", "1.ffn->logits"}
    reads, writes = compiled.reads_and_writes(c)
    assert not [n for n in (*reads, *writes) if n.startswith("0.h")]         # the empty half
    assert writes["1.h0"] != writes["1.h1"] and reads["1.h0.v"] != reads["1.h1.v"]   # two ops


@pytest.mark.slow
def test_frac_prevs_and_reverse_true_edges_by_hand(case):
    """frac_prevs (tokens == "x"): layer 0's MLP maps tokens to is-"x"; layer 1's head averages it
    over the positions up to the query's (query: indices and "one"; key: indices and tokens:BOS;
    value: the map alone: the value's BOS row is zero, so the embedding is no value input).
    reverse: layer 0's head and MLP are length's selector width (the head reads tokens, the MLP its
    output and "one", BOS); layer 1's MLP is opp_idx = length - indices, layer 2's opp_idx - 1;
    layer 3's head moves the token at opp_idx-1 (query: opp_idx-1 and "one"; key: indices, BOS;
    value: tokens). Layers 1 and 2's attention and layer 3's MLP are empty."""
    assert compiled.true_edges(case("frac_prevs")[1]) == {
        "embed->0.ffn", "embed->1.h0.q", "embed->1.h0.k", "0.ffn->1.h0.v", "1.h0->logits"}
    assert compiled.true_edges(case("reverse")[1]) == {
        "embed->0.h0.q", "embed->0.h0.k", "embed->0.h0.v", "embed->0.ffn", "0.h0->0.ffn",
        "embed->1.ffn", "0.ffn->1.ffn", "1.ffn->2.ffn", "embed->3.h0.q", "2.ffn->3.h0.q",
        "embed->3.h0.k", "embed->3.h0.v", "3.h0->logits"}


@pytest.mark.slow
def test_compile_rasp_is_tracr_s_compiler_and_places_blocks_as_its_assembler(case):
    """The same weights and residual directions as tracr's compile_rasp_to_model; each craft block
    in the layer half tracr's assembler puts it (its module names)."""
    from tracr.compiler import assemble, compiling
    program, c, *_ = case("shuffle_dyck")
    theirs = compiling.compile_rasp_to_model(program, {"(", ")"}, 4)
    assert theirs.residual_labels == c.assembled.residual_labels
    for name, part in theirs.params.items():
        for k, a in part.items():
            np.testing.assert_array_equal(np.asarray(c.assembled.params[name][k]), np.asarray(a))
    _, names = assemble._get_model_config_and_module_names(c.craft)
    placed = [f"transformer/layer_{i}/{'mlp' if mlp else 'attn'}"
              for i, mlp, _ in compiled._placed(c.craft)]
    assert placed == names and len({n.split("/")[1] for n in names}) == 6   # some halves empty


def test_encode_refuses_what_the_model_cannot_read_in_one_line(case):
    _, _, _, model, encode, decode = case("pair_balance")
    np.testing.assert_array_equal(encode(["(", ")"]), encode([["(", ")"]]))
    assert encode(["(", ")"]).shape == (1, 3) and model(encode(["(", ")"])).shape == (1, 3, 1)
    for bad in (["(", "b"], [BOS, "("], ["("] * 6, [["("], ["(", ")"]]):
        with pytest.raises(DataError, match="inputs of one length up to 5") as err:
            encode(bad)
        assert "\n" not in str(err.value)


def test_a_program_tracr_cannot_compile_is_one_line():
    oracle("tracr")
    from tracr.rasp import rasp
    same = rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.EQ)
    numerical = rasp.numerical(rasp.Aggregate(same, rasp.tokens, default=0))   # of categorical
    with pytest.raises(ConfigError, match="tracr cannot compile this program: .*encoding") as err:
        compiled.compile_rasp(numerical, {"a"}, 3)
    with pytest.raises(ConfigError, match="tracr's own tokens"):
        compiled.compile_rasp(rasp.tokens, {"a", BOS}, 3)
    assert "\n" not in str(err.value)


def test_the_library_runs_without_tracr(monkeypatch):
    """tracr and haiku are imported inside the functions only; without tracr, one line says how."""
    tree = ast.parse(pathlib.Path(compiled.__file__).read_text(encoding="utf-8"))
    top = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names] + \
        [n.module for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert not [m for m in top if m.split(".")[0] in ("tracr", "haiku")], top
    import sys
    for name in ["tracr", *(m for m in sys.modules if m.startswith("tracr."))]:
        monkeypatch.setitem(sys.modules, name, None)                        # as if not installed
    with pytest.raises(ConfigError, match="tracr is not installed: pip install tracr-pypi"):
        compiled.compile_rasp(None, {"a"}, 3)
