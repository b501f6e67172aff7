"""attention_jax.analysis.faithfulness: the circuit alone runs from the corrupted run (none) to the model
(every edge); the smallest circuit is the first k past the share; a share of a gap too small to measure is
refused, never returned; circuits run in memory-bounded batches."""
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import ConfigError
from attention_jax.analysis import discovery
from attention_jax.analysis.discovery import edge_patch
from attention_jax.analysis.faithfulness import circuit_faithfulness, faithfulness, gap_interval, smallest_circuit
from attention_jax.analysis.pruning import circuit
from attention_jax.errors import NotMeasurable

from helpers import discovery_case


@pytest.fixture(scope="module", params=["pre", "post"])
def case(request):
    return discovery_case(request.param)


def test_faithfulness_runs_from_none_to_the_whole_model(case):
    exact = edge_patch(*case)
    n = len(exact.graph.edges)
    curve = faithfulness(*case, exact, ks=[0, n])
    assert curve[0] == pytest.approx(0.0, abs=1e-6) and curve[1] == pytest.approx(1.0, abs=1e-5)


def test_the_smallest_circuit_is_the_first_k_past_the_share_or_the_largest_asked(case):
    exact = edge_patch(*case)
    curve = faithfulness(*case, exact, ks=range(1, 11))
    found = smallest_circuit(*case, exact, share=0.5, most=10)
    np.testing.assert_allclose(found.curve, curve)
    want = next((k for k in range(1, 11) if curve[k - 1] >= 0.5), None)
    assert found.k == want and found.edges == circuit(exact, k=want or 10)
    assert found.faithfulness == pytest.approx(curve[(want or 10) - 1])
    none = smallest_circuit(*case, exact, share=1e9, most=3)
    assert none.k is None and none.edges == circuit(exact, k=3)
    alone = circuit_faithfulness(*case, [], exact.graph.names(), circuit(exact, k=4))
    np.testing.assert_allclose(alone, [0.0, 1.0, faithfulness(*case, exact, ks=[4])[0]], atol=1e-5)


def test_a_share_of_a_gap_below_its_floor_is_not_measurable(case):
    """A metric whose clean and corrupted values (nearly) agree: faithfulness would be noise over noise."""
    model, clean, corrupted, metric = case
    flat = lambda logits: metric(logits) * 1e-5            # the same circuits, a gap of 1e-5
    exact = edge_patch(*case)
    for ask in (lambda: faithfulness(model, clean, corrupted, flat, exact, ks=[1, 2]),
                lambda: circuit_faithfulness(model, clean, corrupted, flat, []),
                lambda: smallest_circuit(model, clean, corrupted, flat, exact)):
        with pytest.raises(NotMeasurable, match="differ by .* below min_gap=0.001"):
            ask()
    small = faithfulness(model, clean, corrupted, flat, exact, ks=[0, 3], min_gap=1e-6)   # said, and allowed
    np.testing.assert_allclose(small, faithfulness(*case, exact, ks=[0, 3]), atol=2e-2)


@pytest.mark.parametrize("bad", [[-1], [1.5], [True], 3])
def test_circuit_sizes_that_are_no_counts_are_refused(case, bad):
    exact = edge_patch(*case)
    with pytest.raises(ConfigError, match="must be a (whole number|list of circuit sizes)"):
        faithfulness(*case, exact, ks=bad)


@pytest.mark.parametrize("bad", [dict(share=float("nan")), dict(most=0), dict(most=2.0), dict(min_gap=-1.0)])
def test_the_smallest_circuits_arguments_are_checked(case, bad):
    with pytest.raises(ConfigError, match=f"{next(iter(bad))}="):
        smallest_circuit(*case, edge_patch(*case), **bad)


def test_many_circuits_run_in_batches_of_what_fits(case, monkeypatch):
    """A curve of many sizes runs its circuits `batch_size` (or what fits) at a time, not all in one call."""
    exact = edge_patch(*case)
    seen, under = [], discovery._patched

    def spy(*args, **kw):
        seen.append(args[4].shape[0])
        return under(*args, **kw)
    monkeypatch.setattr(discovery, "_patched", spy)
    curve = faithfulness(*case, exact, ks=range(30), batch_size=8)
    assert seen[1:] == [8, 8, 8, 8]                  # the two ends, then 30 circuits 8 at a time
    whole = circuit_faithfulness(*case, *[circuit(exact, k=k) for k in range(30)], batch_size=30)
    np.testing.assert_allclose(curve, whole, atol=1e-5)           # another batch, another rounding


def test_the_gaps_bootstrap_interval_resamples_the_texts_per_prompt_values(case):
    model, clean, corrupted, metric = case
    got = gap_interval(model, clean, corrupted, metric, resamples=2000, seed=1)
    each = np.asarray(metric.per_prompt(model(jnp.asarray(clean))) - metric.per_prompt(model(jnp.asarray(corrupted))))
    draws = np.random.default_rng(1).integers(0, len(each), (2000, len(each)))
    want = np.quantile(each[draws].mean(1), [0.025, 0.975])     # the corrupted end: every edge patched, to rounding
    np.testing.assert_allclose([got.low, got.high], want, atol=1e-4)
    assert got.value == pytest.approx(1.0, abs=1e-5) and got.texts == 2 and got.low <= got.value <= got.high
    plain = gap_interval(model, clean, corrupted, lambda logits: metric(logits))      # no per_prompt: no interval
    assert plain.low is None and not plain.within_noise


def test_a_gap_within_its_noise_is_not_measurable(case, monkeypatch):
    from attention_jax.analysis import faithfulness as F
    monkeypatch.setattr(F, "gap_interval", lambda *a, **k: F.Gap(1.0, -0.5, 2.5, 2))
    with pytest.raises(NotMeasurable, match="within its noise .* -0.5 to 2.5"):
        circuit_faithfulness(*case, [])
