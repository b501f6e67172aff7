"""attention_jax.fingerprint: a function keyed by its code and every value it reads, so a compiled
program is reused exactly when the function would compute the same."""

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

from attention_jax.fingerprint import Keyed, fingerprint

SCALE = 2.0
TABLE = np.arange(4.0)


def helper(x):
    return x * SCALE


def reads_a_global_through_a_helper(x):
    return helper(x) + TABLE.sum()


def recursive(n):
    return 1 if n <= 0 else n * recursive(n - 1)


def test_the_same_function_and_values_make_one_key_and_a_changed_global_another():
    global SCALE, TABLE
    first = Keyed(reads_a_global_through_a_helper)
    assert first == Keyed(reads_a_global_through_a_helper) and hash(first) == hash(Keyed(reads_a_global_through_a_helper))
    try:
        SCALE = 3.0                                   # read by the helper the function calls
        assert Keyed(reads_a_global_through_a_helper) != first
        SCALE, TABLE = 2.0, np.arange(4.0) + 1       # an array's bytes
        assert Keyed(reads_a_global_through_a_helper) != first
    finally:
        SCALE, TABLE = 2.0, np.arange(4.0)
    assert Keyed(reads_a_global_through_a_helper) == first


def test_closures_defaults_partials_and_dataclasses_by_value():
    make = lambda k: (lambda x: x + k)
    assert Keyed(make(1)) == Keyed(make(1)) and Keyed(make(1)) != Keyed(make(2))
    assert Keyed(make(jnp.ones(3))) == Keyed(make(jnp.ones(3))) != Keyed(make(jnp.zeros(3)))

    def with_default(x, k=1):
        return x + k
    other = with_default
    assert Keyed(with_default) == Keyed(other)
    assert Keyed(functools.partial(with_default, k=1)) != Keyed(functools.partial(with_default, k=2))

    @dataclasses.dataclass(frozen=True)
    class Metric:
        answer: object

        def __call__(self, logits):
            return logits[..., self.answer]
    assert Keyed(Metric(np.array([1, 2]))) == Keyed(Metric(np.array([1, 2]))) != Keyed(Metric(np.array([1, 3])))


def test_what_cannot_be_compared_is_equal_to_nothing():
    class Opaque:
        def __call__(self, x):
            return x
    opaque = Opaque()
    assert Keyed(opaque) != Keyed(opaque)                                 # it compiles its own program each call
    assert Keyed(lambda x: x + len([opaque])) != Keyed(lambda x: x + len([opaque]))
    reads = lambda x: x + len([opaque])                                    # one function reading it: unequal too
    assert Keyed(reads) != Keyed(reads)


def test_libraries_by_identity_cycles_end():
    assert fingerprint(jnp.mean) == fingerprint(jnp.mean) and fingerprint(np.sum) == fingerprint(np.sum)
    assert Keyed(recursive) == Keyed(recursive) and Keyed(recursive)(4) == 24


def test_a_module_s_attribute_the_code_reads_counts():
    import types
    settings = types.ModuleType("settings")
    settings.ANSWER = 3
    namespace = {"settings": settings}
    exec("def metric(x):\n    return x + settings.ANSWER", namespace)
    first = Keyed(namespace["metric"])
    settings.ANSWER = 7
    assert Keyed(namespace["metric"]) != first


def test_a_digest_is_the_same_in_another_process_and_tells_code_apart():
    import subprocess
    import sys
    code = ("import sys; sys.path.insert(0, 'tests'); from attention_jax.fingerprint import digest; "
            "from test_fingerprint import reads_a_global_through_a_helper as f; print(digest(f))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    from attention_jax.fingerprint import digest
    assert other == digest(reads_a_global_through_a_helper) != digest(recursive)
    assert digest(jnp.mean) == digest(jnp.mean)


class Settings:
    """A class used as a namespace, as a metric of one's own might read its settings."""
    SCALE = 2.0
    UNREAD = [object()]                      # nothing reads it: no reason for a key equal to nothing

    @classmethod
    def scaled(cls, x):
        return x * cls.FACTOR

    FACTOR = 3.0


def reads_a_class(x):
    return x * Settings.SCALE


def calls_a_class_method(x):
    return Settings.scaled(x)


def test_a_class_is_keyed_by_what_the_code_reads_of_it_not_by_its_identity():
    """A setting read from a class (a namespace, a class in a closure, through its own method) was keyed
    by the class's identity: after it changed, the program traced with the old value was served."""
    closure = (lambda cls: (lambda x: x * cls.SCALE))(Settings)
    first = {f: Keyed(f) for f in (reads_a_class, calls_a_class_method, closure)}
    assert all(Keyed(f) == k for f, k in first.items())                  # still cached: equal to itself
    try:
        Settings.SCALE = 5.0
        assert Keyed(reads_a_class) != first[reads_a_class] and Keyed(closure) != first[closure]
        assert Keyed(calls_a_class_method) == first[calls_a_class_method]  # it reads FACTOR, not SCALE
        Settings.FACTOR = 4.0
        assert Keyed(calls_a_class_method) != first[calls_a_class_method]
    finally:
        Settings.SCALE, Settings.FACTOR = 2.0, 3.0
    assert all(Keyed(f) == k for f, k in first.items())


def test_a_dataclass_s_method_and_a_module_in_a_closure_count_what_they_read():
    import types

    @dataclasses.dataclass(frozen=True)
    class Scaled:
        answer: int

        def __call__(self, logits):
            return logits[..., self.answer] * SCALE          # a global its method reads
    global SCALE
    first = Keyed(Scaled(1))
    settings = types.ModuleType("settings")
    settings.ANSWER = 3
    held = (lambda module: (lambda x: x + module.ANSWER))(settings)
    before = Keyed(held)
    try:
        SCALE = 3.0
        assert Keyed(Scaled(1)) != first
        settings.ANSWER = 7
        assert Keyed(held) != before
    finally:
        SCALE = 2.0
    assert Keyed(Scaled(1)) == first


def test_a_sweep_gives_the_new_number_after_a_class_attribute_its_metric_reads_changes():
    """The patching sweep compiles its metric in: keyed by the class's identity, it was served the
    program traced with the old setting, and gave the old number."""
    from flax import nnx
    from attention_jax.analysis.patching import activation_patch
    from attention_jax.config import ModelConfig
    from attention_jax.model import LanguageModel
    model = LanguageModel(ModelConfig(vocab_size=16, context=6, d_model=16, n_heads=2), rngs=nnx.Rngs(0))
    clean = np.array([[1, 2, 3, 4, 5, 6]])
    corrupted = clean.copy()
    corrupted[0, 2] = 9
    held = (lambda cls: (lambda logits: logits[0, -1, 3] * cls.SCALE))(Settings)
    for metric in (lambda logits: logits[0, -1, 3] * Settings.SCALE, held):
        sweep = lambda: activation_patch(model, clean, corrupted, metric, into="corrupted").values
        first = sweep()
        try:
            Settings.SCALE = 5.0
            again = sweep()
        finally:
            Settings.SCALE = 2.0
        assert np.abs(first).max() > 0
        np.testing.assert_allclose(again, first * 2.5, rtol=1e-5)
