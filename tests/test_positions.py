"""The positions experiment: five encodings trained on 64 tokens, read on 64/128/256 (smoke
preset), the premise that training never touches learned rows past 64, and its claims."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.model import LanguageModel
from experiments import positions


@pytest.fixture(scope="module")
def run(smoke_positions):
    return smoke_positions


@pytest.mark.slow
def test_smoke_run_reads_every_encoding_at_every_length(run):
    code, stdout, folder, results = run
    assert code == 0, stdout
    rows = results["rows"]
    assert [r["name"] for r in rows] == list(positions.KINDS)
    params = {r["name"]: r["params"] for r in rows}
    # Only the learned table has parameters: 256 rows of width 128.
    assert params["learned"] - params["none"] == 256 * 128
    assert len({params[k] for k in positions.KINDS if k != "learned"}) == 1
    for r in rows:
        assert set(r["ppl"]) == {"64", "128", "256"} and all(math.isfinite(v) for v in r["ppl"].values())
        # At the training length the measurement is the training loop's own val perplexity.
        assert r["ppl"]["64"] == r["val_ppl"]
        assert r["config"]["context"] == 64 and r["config"]["positions"] == r["name"]
    assert len(results["claims"]) == 5
    assert (folder / "positions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (folder / "table.md").read_text()
    assert "ppl @256" in table and "44.95" in table and "42.49" in table


@pytest.mark.slow
def test_training_never_touches_learned_rows_past_the_window():
    cfg = ModelConfig(vocab_size=32, context=8, max_positions=32, d_model=16, n_heads=2, positions="learned")
    model = LanguageModel(cfg, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (4, 9), 0, 32)
    loss = lambda m: -jnp.mean(jax.nn.log_softmax(m(tokens[:, :-1]))[..., 0])
    grad = nnx.jit(nnx.grad(loss))(model).position_embed.embedding[...]
    assert np.abs(np.asarray(grad[:8])).sum() > 0           # the window's rows learn
    np.testing.assert_array_equal(np.asarray(grad[8:]), 0)  # the rest stay as initialised
    assert model(jnp.zeros((1, 32), jnp.int32)).shape == (1, 32, 32)   # but can be read


def _records(table):
    return {k: {"ppl": {str(L): v for L, v in zip(positions.LENGTHS, row)}} for k, row in table.items()}


def test_claims_follow_the_book_and_can_fail():
    book_like = {"none": (50, 52, 55), "learned": (40, 90, 300), "sinusoidal": (45, 70, 150),
                 "rope": (44, 46, 49), "alibi": (45, 44, 43)}
    assert [c["passed"] for c in positions.claims(_records(book_like))] == [True] * 5
    broken = dict(book_like, learned=(46, 45, 44), alibi=(45, 47, 49))
    passed = {c["claim"]: c["passed"] for c in positions.claims(_records(broken))}
    assert [k for k, ok in passed.items() if not ok] == [
        "learned positions win at the training length (64)",
        "learned positions get worse with every length past training",
        "RoPE degrades more gently than learned and sinusoidal (256/64)",
        "ALiBi improves with length (256 better than 64)"]
