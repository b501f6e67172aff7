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
