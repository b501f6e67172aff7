"""experiments.harness.compile_clock: the programs a run made and the seconds they took."""

import jax
import jax.numpy as jnp

from experiments.harness import compile_clock


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
    nothing = compile_clock.since(compile_clock.start())
    assert compile_clock.describe(nothing) == "XLA programs: none compiled; tracing and lowering 0.0 s"


def test_an_experiment_prints_what_it_compiled_and_keeps_it(tmp_path, capsys):
    import json

    import jax.monitoring
    from experiments.harness.experiment import Experiment, Result

    def run(ctx):   # two programs no other test compiles
        for power in (3, 5):
            jax.jit(lambda x: x ** power + 0.375)(jnp.arange(11.0)).block_until_ready()
        return Result(rows=[], claims=[], tables={})

    seen = []     # an independent count of the programs compiled while the experiment runs
    listen = lambda event, duration, **_: seen.append(duration) if event == compile_clock.COMPILE else None
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        assert Experiment("clocked", "a probe", {"smoke": {}}, run).main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    took = json.loads((tmp_path / "clocked" / "results.json").read_text())["time"]
    assert took["programs"] == len(seen) >= 2 and abs(took["compile_s"] - sum(seen)) < 0.01
    said = capsys.readouterr().out.strip().splitlines()
    assert said[-3] == f"{compile_clock.describe(took)}; the whole run took {took['wall_s']:.1f} s" and said[-1].startswith("wrote ")


def test_a_run_measured_in_child_processes_says_so():
    made = {"programs": 0, "from_cache": 0, "compile_s": 0.0, "trace_and_lower_s": 0.0, "in_children": True}
    assert compile_clock.describe(made) == ("XLA programs: none compiled in this process "
                                            "(its measurements compile in their own)")
