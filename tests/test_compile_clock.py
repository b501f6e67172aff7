"""attention_jax.harness.compile_clock: the programs a run made and the seconds they took."""

import jax
import jax.numpy as jnp

from attention_jax.harness import compile_clock


def test_a_new_program_is_counted_once_and_a_reused_one_not_at_all():
    x = jnp.ones(7)
    mark = compile_clock.start()
    fn = jax.jit(lambda x: jnp.tanh(x) * 3.25 + 0.125)      # a program no other test compiles
    fn(x).block_until_ready()
    made = compile_clock.since(mark)
    assert made["programs"] == 1 and made["compile_s"] > 0 and made["trace_and_lower_s"] > 0
    fn(x).block_until_ready()                               # the same shapes: the compiled program again
    assert compile_clock.since(mark)["programs"] == 1
    assert compile_clock.describe(made).startswith("XLA programs: 1 compiled in ")
    assert compile_clock.describe(compile_clock.since(compile_clock.start())) == "XLA programs: none compiled"


def test_an_experiment_prints_what_it_compiled_and_keeps_it(tmp_path, capsys):
    from experiments import averaging
    assert averaging.main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert said[-3].startswith("XLA programs: ") and said[-3].endswith(" s in all") and said[-1].startswith("wrote ")


def test_a_run_measured_in_child_processes_says_so():
    made = {"programs": 0, "from_cache": 0, "compile_s": 0.0, "trace_and_lower_s": 0.0, "in_children": True}
    assert compile_clock.describe(made) == ("XLA programs: none compiled in this process "
                                            "(its measurements compile in their own)")
