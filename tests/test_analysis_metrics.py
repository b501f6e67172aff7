"""attention_jax.analysis.metrics: the KL divergence and the squared error are zero on the clean run and what
they say by hand elsewhere; each metric's value per text is what its mean is made of."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.analysis.metrics import kl_divergence, logit_diffs, normalized_logit_diff, squared_error
from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError
from attention_jax.model import LanguageModel


@pytest.fixture(scope="module")
def case():
    model = LanguageModel(ModelConfig(vocab_size=50, context=8, d_model=32, n_layers=2, n_heads=4), rngs=nnx.Rngs(0))
    clean = np.random.default_rng(0).integers(0, 50, (3, 8))
    corrupted = clean.copy()
    corrupted[:, 2] = (corrupted[:, 2] + 7) % 50
    return model, clean, corrupted, normalized_logit_diff(model, clean, corrupted, 3, 4)


def test_the_normalised_metric_is_the_mean_of_its_values_per_text(case):
    model, clean, corrupted, metric = case
    logits = model(jnp.asarray(corrupted))
    # The two differ by a float32 rounding of the logit difference, in units of this random model's small gap.
    rounding = 4 * float(np.finfo(np.float32).eps) / abs(metric.clean - metric.corrupted)
    assert float(metric(logits)) == pytest.approx(float(jnp.mean(metric.per_prompt(logits))), abs=rounding)
    each = np.asarray(logits)[:, -1, 3] - np.asarray(logits)[:, -1, 4]
    np.testing.assert_allclose(logit_diffs(logits, 3, 4), each, rtol=1e-6)


def test_kl_divergence_is_zero_on_the_clean_run_and_lower_is_better(case):
    model, clean, corrupted, _ = case
    kl = kl_divergence(model, clean)
    assert kl.lower_is_better and float(kl(model(jnp.asarray(clean)))) == pytest.approx(0.0, abs=1e-6)
    by_hand = lambda lg: float(np.mean(np.sum(p * (np.log(p) - np.log(_softmax(lg))), -1)))    # in float64
    p = _softmax(model(jnp.asarray(clean))[:, -1])
    corrupted_logits = model(jnp.asarray(corrupted))
    # The corrupted run's divergence is 1e-4 here: float32's log-softmax rounds each term by ~1e-7.
    assert float(kl(corrupted_logits)) == pytest.approx(by_hand(corrupted_logits[:, -1]), abs=2e-6)
    assert by_hand(corrupted_logits[:, -1]) > 0
    far = corrupted_logits + jax.random.normal(jax.random.key(0), corrupted_logits.shape)  # a divergence of ~0.5
    assert float(kl(far)) == pytest.approx(by_hand(far[:, -1]), rel=1e-5) and by_hand(far[:, -1]) > 0.1
    every = kl_divergence(model, clean, position=None)
    assert float(every(model(jnp.asarray(corrupted)))) > 0 and kl == kl_divergence(model, clean)
    with pytest.raises(ConfigError, match="position=8 must be a position"):
        kl_divergence(model, clean, position=8)


def test_squared_error_is_zero_on_the_clean_run_and_its_mean_squared_distance_past_start(case):
    model, clean, corrupted, _ = case
    se = squared_error(model, clean)
    assert se.lower_is_better and float(se(model(jnp.asarray(clean)))) == 0.0
    a, b = (np.asarray(model(jnp.asarray(t)), np.float64)[:, 1:] for t in (clean, corrupted))
    assert float(se(model(jnp.asarray(corrupted)))) == pytest.approx(np.mean((a - b) ** 2), rel=1e-5)
    np.testing.assert_allclose(se.per_prompt(model(jnp.asarray(corrupted))), ((a - b) ** 2).mean((1, 2)), rtol=1e-5)
    for bad in (8, -1, True):
        with pytest.raises(ConfigError, match="start="):
            squared_error(model, clean, start=bad)


def _softmax(logits) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
