"""inside_tiny_gpt: the smoke command writes its tables, claims and PNGs (that a rerun reopens the
cached model is checked by the notebook's test, which reruns it from these rows); the raw-weight forward equals the module (trained and randomly initialised, no
module called); ablations restore the model and the data-driven paths equal inspect.ablate;
the ASCII and PNG heatmap writers; the claims can fail."""

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import model as model_lib
from attention_jax.config import ModelConfig
from attention_jax.data import tiny_world as tw
from attention_jax.errors import ConfigError
from experiments.harness import report
from attention_jax.analysis.inspect import ablate, run_with_cache
from experiments import inside_tiny_gpt as E

# A small model of the lecture's shape (pre-norm, tied, biased q/k/v), context 24 = fact prompt + 10.
SMALL = ModelConfig(vocab_size=44, context=24, d_model=32, n_layers=2, n_heads=4, tie_embeddings=True,
                    qkv_bias=True)
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(smoke_tiny_gpt):
    """The suite's one smoke run (conftest.smoke_tiny_gpt): (folder, (code, stdout, results)). The
    notebook's test runs the command again on its rows and checks that nothing trains."""
    r = smoke_tiny_gpt
    return r["folder"], (r["code"], r["stdout"], r["results"])


@pytest.fixture(scope="module")
def small():
    return model_lib.LanguageModel(SMALL, rngs=nnx.Rngs(3))


@pytest.mark.slow
def test_no_figure_of_the_smoke_run_has_a_blank_panel(smoke_tiny_gpt):
    from experiments.harness import report
    figures = smoke_tiny_gpt["figures"]
    assert figures and {name: report.empty_axes(fig) for name, fig in figures.items() if report.empty_axes(fig)} == {}


@pytest.mark.slow
def test_smoke_command_writes_tables_claims_and_pngs(runs):
    folder, (code, stdout, results) = runs
    assert code == 0, stdout
    table = (folder / "table.md").read_text()
    for title in ("Parameters by formula", "GPT-3", "raw weights", "residual stream", "Attention at the last",
                  "ASCII", "random q, k", "own scores", "Ablations"):
        assert title in table, title
    for lecture in ("0.409", "5.022", "6.799", "1.348", "5.499", "7.528", "5.459", "109,056"):
        assert lecture in table, lecture           # the lecture's figures sit beside ours
    for name in ("attention.png", "ablations.png", "sqrt_d.png", "residual.png", "training.png"):
        assert (folder / name).read_bytes()[:8] == PNG, name
    assert '"layers": 2, "heads": 4' in (folder / "attention.html").read_text()     # the viewer, every head
    claims = {c["claim"]: c for c in results["claims"]}
    assert len(claims) == 7 and all("margin" in c for c in claims.values())
    for text in ("parameters by formula = the framework's count, component by component",
                 "the forward pass from the raw weights = the module's logits, to float32 rounding "
                 "(max |diff| <= 1e-06 x the largest |logit|)",
                 "attention puts exactly zero weight on the future",
                 "random q·k has std ≈ √d_k (within 5% at every d_k)"):
        assert claims[text]["passed"], claims[text]   # these hold whatever the training budget
    keys = [r["key"] for r in results["rows"]]
    assert keys[:2] == ["intact", "uniform"] and "bidirectional" in keys and "positions" in keys
    assert {f"head {i}.{h}" for i in range(2) for h in range(4)} <= set(keys)
    assert {f"{part} {i}" for part in ("attention", "mlp") for i in range(2)} <= set(keys)
    assert results["forward"]["max_abs_diff"] <= 1e-5
    assert results["attention"]["future_sum"] == 0.0
    assert results["ablation_engine_consistency"] < 1e-4   # the ablations' bits/char = the engine's nll
    parts = {r["part"]: r for r in results["parameters"]}
    assert parts["total"]["by_formula"] == parts["total"]["framework"] == 109_056
    assert "max |raw - module|" in stdout and "@" in results["heatmap"]


@pytest.mark.slow
@pytest.mark.parametrize("change", [{}, {"tie_embeddings": False, "qkv_bias": False, "positions": "none"}])
def test_raw_forward_equals_the_module_without_calling_it(small, change, monkeypatch):
    import dataclasses
    cfg = dataclasses.replace(SMALL, **change)
    model = small if not change else model_lib.LanguageModel(cfg, rngs=nnx.Rngs(4))
    ids = np.asarray(jax.random.randint(jax.random.key(5), (17,), 0, cfg.vocab_size), np.int32)
    ref = np.asarray(E.compiled().forward(model, jnp.asarray(ids)[None])[0])
    shapes = []

    def forbidden(*args, **kwargs):
        raise AssertionError("raw_forward called a module")

    with monkeypatch.context() as mp:   # no module's __call__ may run: the weights alone
        for cls in (model_lib.LanguageModel, model_lib.Block, model_lib.MultiHeadAttention, model_lib.Dense,
                    model_lib.LayerNorm, model_lib.FeedForward, nnx.Embed):
            mp.setattr(cls, "__call__", forbidden)
        mine = np.asarray(E.raw_forward(model, ids, lambda step, shape: shapes.append(tuple(shape))))
    assert np.abs(mine - ref).max() <= 1e-5
    T, d, H = len(ids), cfg.d_model, cfg.heads_used
    assert shapes[0] == (T, d) and (H, T, T) in shapes and (T, cfg.d_ff) in shapes and shapes[-1] == (T, 44)
    check = E.forward_check(model, ids, lambda *a: None)      # the command's check: the compiled module
    assert check["max_abs_diff"] <= 1e-5


@pytest.mark.slow
def test_raw_forward_and_formula_refuse_other_architectures():
    import dataclasses
    post = model_lib.LanguageModel(dataclasses.replace(SMALL, norm="post"), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError):
        E.raw_forward(post, np.zeros(4, np.int32))
    with pytest.raises(ConfigError):
        E.param_parts(dataclasses.replace(SMALL, mixer="average"))


@pytest.mark.parametrize("change", [{}, {"tie_embeddings": False, "bias": False, "n_layers": 3}])
def test_formula_equals_the_framework(change):
    import dataclasses
    cfg = dataclasses.replace(SMALL, **change)
    model = nnx.eval_shape(lambda: model_lib.LanguageModel(cfg, rngs=nnx.Rngs(0)))
    rows, gpt3, _ = E.demo_params(model)
    assert all(r["equal"] for r in rows) and rows[-1]["by_formula"] == rows[-1]["framework"]
    assert gpt3[0]["count"] == 12 * 96 * 12288 ** 2


@pytest.mark.slow
def test_ablations_restore_the_model(small):
    x = jax.random.randint(jax.random.key(1), (2, 20), 0, 44)
    before = np.asarray(small(x))
    for key, _, kw in E.ablation_list(SMALL):
        with ablate(small, **kw):
            during = np.asarray(small(x))
        after = np.asarray(small(x))
        np.testing.assert_array_equal(after, before, err_msg=key)
        if key != "intact":
            assert np.abs(during - before).max() > 1e-4, key     # each ablation changes the model
    with pytest.raises(RuntimeError):                           # restored even when the body raises
        with ablate(small, mixer=[1], feed_forward=[0], heads={0: [1]}, positions=True):
            raise RuntimeError("inside")
    np.testing.assert_array_equal(np.asarray(small(x)), before)


@pytest.mark.slow
def test_data_driven_paths_equal_inspect_ablate(small):
    run = E.compiled()
    x = np.asarray(jax.random.randint(jax.random.key(2), (3, SMALL.context), 0, 44), np.int32)
    heads = {1: [2], 0: [0, 3]}             # heads off by a 0/1 mask (one compile) = ablate(heads=...)
    with ablate(small, heads=heads):
        ref = np.asarray(run.forward(small, jnp.asarray(x)))
    mine = np.asarray(run.forward_heads(small, jnp.asarray(x), E.head_mask(SMALL, heads)))
    assert np.abs(mine - ref).max() <= 1e-5
    assert E.head_mask(SMALL, heads).tolist() == [[0, 1, 1, 0], [1, 1, 0, 1]]
    n = 9                                   # the padded prefix mask = the bidirectional model on n tokens
    with ablate(small, bidirectional=True):
        ref = np.asarray(run.forward(small, jnp.asarray(x[:, :n])))
    mine = np.asarray(run.forward_prefix(small, jnp.asarray(x), jnp.int32(n)))[:, :n]
    assert np.abs(mine - ref).max() <= 1e-5
    # cached_run pads to the context: the first T positions are the unpadded run's
    ids = x[0, :11]
    cache = E.cached_run(small, ids)
    assert cache["blocks.1.mixer.attention.weights"].shape == (1, 4, 11, 11)
    _, ref = nnx.jit(lambda m, t: run_with_cache(m, t, ["blocks.1.resid_post", "blocks.1.mixer.attention.weights"]))(
        small, jnp.asarray(ids)[None])
    for name in ref:
        np.testing.assert_allclose(cache[name], np.asarray(ref[name]), atol=1e-5, err_msg=name)


@pytest.mark.slow
def test_greedy_decoding_and_teacher_forcing(small):
    tok = tw.CharTokenizer()
    world = tw.build_world(tw.WorldSpec(n_people=3, n_cities=2, train_epochs=1, val_epochs=1, reviews_per_epoch=1))
    made = E.greedy_completions(small, tok, world, max_new=4)
    assert len(made) == 3
    for prompt, new in made.items():    # each generated id is the argmax given the text before it
        ids = np.concatenate([tok.encode(prompt), new])
        logits = np.asarray(E.compiled().forward(small, jnp.asarray(ids)[None]))[0]
        np.testing.assert_array_equal(logits[len(prompt) - 1:-1].argmax(-1), new)
    assert E.greedy_accuracy(small, tok, world) == E.teacher_forced_accuracy(small, tok, world) == 0.0
    with pytest.raises(ConfigError):
        E.greedy_completions(small, tok, world, max_new=SMALL.context)


def test_ascii_heatmap_shades_by_value_only():
    w = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.35, 0.4]])
    lines = E.ascii_heatmap(w, list("abc")).splitlines()
    assert lines == ["     abc", "  a  @  ", "  b  ++ ", "  c  :-="]
    full = E.ascii_heatmap(np.full((3, 3), 1 / 3), list("⏎xy")).splitlines()
    assert full[1] == "  ⏎  ---"                     # a bidirectional head shows its upper triangle
    with pytest.raises(ConfigError):
        E.ascii_heatmap(np.ones((2, 3)), list("ab"))


@pytest.mark.slow
def test_heatmap_png(tmp_path):
    mats = {f"head {h}": np.tril(np.ones((5, 5))) / np.arange(1, 6)[:, None] for h in range(3)}
    fig = E.heatmap_figure(mats, list("⏎a b:"), "test", ncols=2, highlight=[1])
    assert len([ax for ax in fig.axes if ax.images]) == 3
    path = report.save_figure(fig, tmp_path / "heat.png")
    assert path.read_bytes()[:8] == PNG


def _rows(**over):
    base = {"intact": (0.4, 0.9), "positions": (5.0, 0.0), "attention 0": (6.8, 0.0),
            "attention 1": (1.3, 0.05), "bidirectional": (7.5, 0.0)}
    base.update(over)
    return {k: {"bpc": b, "acc": a} for k, (b, a) in base.items()}


def test_ablation_claims_pass_and_fail():
    assert [c["passed"] for c in E.ablation_claims(_rows())] == [True, True, True]
    failed = E.ablation_claims(_rows(positions=(0.3, 0.9), **{"attention 0": (0.5, 0.6), "attention 1": (0.5, 0.46)},
                                     bidirectional=(0.39, 0.0)))
    assert [c["passed"] for c in failed] == [False, False, False]
    assert failed[1]["margin"] == pytest.approx(0.45 - 0.46)


@pytest.mark.slow
def test_sqrt_d_random_is_the_scaling_sweep_at_the_lectures_sizes(runs):
    # The smoke run's own sweep (50 random rows per d_k), not a second one.
    from experiments import scaling
    rows = runs[1][2]["sqrt_d_random"]
    assert [r["d_k"] for r in rows] == list(scaling.WIDTHS)
    assert runs[1][2]["config"]["sqrt_d"]["rows"] == 50                  # constants.SQRT_D_ROWS["smoke"]
    assert runs[1][2]["config"]["sqrt_d"]["pairs"] == 2_000              # constants.SQRT_D_PAIRS["smoke"]
    for r in rows:
        assert abs(r["std"] / r["sqrt_d"] - 1) < 0.05
        assert r["scaled_saturated"] == 0.0 and r["raw_max"] > r["scaled_max"]
    assert rows[-1]["saturated"] > rows[2]["saturated"] > rows[0]["saturated"]


def test_corpus_flags_are_refused(tmp_path):
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert E.main(["--preset", "smoke", "--corpus", "x.txt", "--out", str(tmp_path)]) == 2
    assert "generated world" in err.getvalue()
