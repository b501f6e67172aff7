"""The command-line convention: `--help` answers at once (no JAX imported), argparse's own errors
follow the one-line rule, and `--out` is proven writable before any work."""

import pathlib
import subprocess
import sys
import time

import pytest

from attention_jax.errors import ConfigError
from experiments.harness import cli

REPO = pathlib.Path(__file__).resolve().parents[1]
EXPERIMENTS = ["ladder", "positions", "averaging", "scaling", "params", "parity", "complexity", "throughput"]

PROBE = """
import runpy, sys
sys.argv = ["experiments.{name}", "--help"]
try:
    runpy.run_module("experiments.{name}", run_name="__main__", alter_sys=True)
except SystemExit as e:
    assert e.code in (0, None), e.code
heavy = sorted(m for m in ("jax", "jaxlib", "flax", "optax", "orbax", "torch", "matplotlib") if m in sys.modules)
print("HEAVY", ",".join(heavy))
"""


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_help_imports_no_jax(name):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(name=name)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: python -m experiments." in proc.stdout and "--preset" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY", proc.stdout.splitlines()[-1]


def test_ladder_help_answers_within_a_second():
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "experiments.ladder", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0 and "--corpus" in proc.stdout
    assert seconds < 1.0 or seconds < 2.5 and _busy(), f"--help took {seconds:.2f} s"


def _busy() -> bool:
    """A loaded 2-core machine (another test process) may slow Python's own start; say so rather than flake."""
    import os
    return os.getloadavg()[0] > 1.5


def test_argparse_errors_are_config_errors_naming_the_fix():
    p = cli.parser("ladder", "x", {"smoke": None})
    cli.add_training_args(p, ["a", "b"])
    with pytest.raises(ConfigError) as info:
        p.parse_args(["--steps", "many"])
    assert "argument --steps: 'many' is not a whole number" in str(info.value)
    assert "python -m experiments.ladder --help" in str(info.value)


def test_a_flag_is_never_taken_for_the_start_of_another():
    """`--seed 3` trained three seeds (argparse took it for --seeds); a flag's start is refused,
    naming it."""
    p = cli.parser("ladder", "x", {"smoke": None})
    cli.add_training_args(p, ["a", "b"])
    with pytest.raises(ConfigError, match="unrecognized arguments: --eval 3"):
        p.parse_args(["--eval", "3"])
    assert p.parse_args(["--seeds", "3"]).seeds == 3


def test_seed_trains_the_one_seed_it_names_beside_seeds_counting_from_0():
    """--seeds N counts seeds from 0, so seed 3 alone could not be trained: --seed S trains it;
    both given is one line naming them; a seed below 0 is argparse's one line."""
    p = cli.parser("ladder", "x", {"smoke": None})
    cli.add_training_args(p, ["a", "b"])
    assert cli.seeds(p.parse_args(["--seed", "3"])) == [3]
    assert cli.seeds(p.parse_args(["--seeds", "3"])) == [0, 1, 2]
    assert cli.seeds(p.parse_args([])) == [0]
    with pytest.raises(ConfigError, match="--seed 3 and --seeds 2 both given.*drop one"):
        cli.seeds(p.parse_args(["--seed", "3", "--seeds", "2"]))
    with pytest.raises(ConfigError, match="argument --seed: -1 must be a whole number from 0"):
        p.parse_args(["--seed", "-1"])


@pytest.mark.parametrize("name", ["", " "])
def test_an_empty_out_is_refused(name):
    with pytest.raises(ConfigError, match="--out is empty"):
        cli.results_folder(name, "ladder")


def test_out_naming_a_file_is_refused_before_any_work(tmp_path):
    target = tmp_path / "a file"
    target.write_text("not a folder")
    with pytest.raises(ConfigError) as info:
        cli.results_folder(str(target), "ladder")
    assert "cannot write results into" in str(info.value) and "\n" not in str(info.value)


def test_proving_out_writable_leaves_no_folder_behind(tmp_path):
    folder = cli.results_folder(str(tmp_path / "new" / "deeper"), "ladder")
    assert folder == tmp_path / "new" / "deeper" / "ladder" and not (tmp_path / "new").exists()


def test_names_keep_the_table_order_unless_asked_as_given():
    known = ["auto", "reference", "chunked", "fused"]
    assert cli.choose_names("fused,reference", known) == ["reference", "fused"]
    assert cli.choose_names("chunked,reference,chunked", known, as_given=True) == ["chunked", "reference"]
    with pytest.raises(ConfigError, match="unknown attention 'flash'"):
        cli.choose_names("flash", known, "attention", as_given=True)


@pytest.mark.slow
def test_steps_per_call_from_the_environment_is_checked_and_announced_before_any_work(tmp_path, monkeypatch, capsys):
    from experiments import params
    monkeypatch.setenv("ATTENTION_JAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTENTION_JAX_STEPS_PER_CALL", "many")
    assert params.main(["--preset", "smoke", "--out", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert err.strip().splitlines()[-1].startswith("error: ATTENTION_JAX_STEPS_PER_CALL='many'")
    assert not (tmp_path / "params" / "results.json").exists()
    monkeypatch.setenv("ATTENTION_JAX_STEPS_PER_CALL", "4")
    assert params.main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    assert "training: up to 4 steps per compiled call" in capsys.readouterr().out


def test_the_lab_reads_steps_per_call_from_the_environment_and_refuses_nonsense(monkeypatch):
    from experiments.harness.experiment import STEPS_PER_CALL_ENV, steps_per_call_from_env
    monkeypatch.delenv(STEPS_PER_CALL_ENV, raising=False)
    assert steps_per_call_from_env() is None
    monkeypatch.setenv(STEPS_PER_CALL_ENV, "2")
    assert steps_per_call_from_env() == 2
    for bad in ("0", "-3", "two", "²"):
        monkeypatch.setenv(STEPS_PER_CALL_ENV, bad)
        with pytest.raises(ConfigError, match=STEPS_PER_CALL_ENV) as err:
            steps_per_call_from_env()
        assert "\n" not in str(err.value), err.value    # one line: the CLI prints it alone


def test_a_preemption_is_reported_as_its_own_line_and_exit_130(capsys):
    from attention_jax.errors import Preempted
    assert cli.report_error(Preempted(36)) == cli.EXIT_INTERRUPTED == 130
    err = capsys.readouterr().err.strip()
    assert err == "preempted: every process saved step 36 and stopped; rerun the same command to continue from it"


def test_an_interrupt_python_must_ignore_prints_no_traceback():
    """Ctrl-C landing in a weakref callback (garbage collection) is kept by the STOP note, not printed."""
    code = """
import weakref
from experiments.harness.cli import STOP
from experiments.harness import cli
cli.catch_interrupts()
class Thing: pass
def interrupted(ref): raise KeyboardInterrupt          # where the SIGINT handler's raise lands
def broken(ref): raise ValueError("a real bug")
one, two = Thing(), Thing()
refs = weakref.ref(one, interrupted), weakref.ref(two, broken)
STOP.set()
del one
del two
print("STOP", STOP.is_set())
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "STOP True"
    assert "KeyboardInterrupt" not in proc.stderr            # the interrupt: silent, STOP holds it
    assert "ValueError: a real bug" in proc.stderr           # anything else: Python's report as before


def test_a_run_from_the_api_writes_where_it_is_told_or_to_a_temporary_folder(tmp_path, monkeypatch, capsys):
    from experiments import averaging
    monkeypatch.chdir(tmp_path)
    result = averaging.EXPERIMENT(preset="smoke")
    assert list(tmp_path.iterdir()) == []                                     # nothing in the current folder
    assert result.folder.is_dir() and (result.folder / "results.json").exists()
    assert f"results: {result.folder}" in capsys.readouterr().out
    kept = averaging.EXPERIMENT(preset="smoke", out=str(tmp_path / "mine"))
    assert kept.folder == tmp_path / "mine" / "averaging" and (kept.folder / "results.json").exists()


def test_a_coordinator_nobody_answers_stops_the_run_in_one_line(tmp_path, capsys):
    import socket
    from experiments import ladder
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ladder.main(["--preset", "smoke", "--out", str(tmp_path), "--coordinator", f"127.0.0.1:{port}",
                        "--num-processes", "2", "--process-id", "1", "--connect-timeout", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"no coordinator answered at 127.0.0.1:{port}" in err


def test_a_process_id_outside_the_count_is_refused_before_waiting(tmp_path, capsys):
    """--process-id 5 of 2 waited for the coordinator's timeout, then blamed the address."""
    import time
    from experiments import ladder
    began = time.perf_counter()
    code = ladder.main(["--preset", "smoke", "--out", str(tmp_path), "--coordinator", "127.0.0.1:1",
                        "--num-processes", "2", "--process-id", "5", "--connect-timeout", "30"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--process-id 5 is outside 0 .. 1" in err and time.perf_counter() - began < 20


# A committed record beside the code, damaged: smoke times of another shape or a results file cut short.
DAMAGE = {"smoke times cut short": ("smoke_times.json", '{"seconds": {"ladder": 2'),
          "smoke times of another shape": ("smoke_times.json", '{"seconds": [20.8, 18.0]}'),
          "smoke times as words": ("smoke_times.json", '{"seconds": {"ladder": "fast"}}'),
          "results cut short": ("ladder/results.json", '{"name": "ladder", "claims": ['),
          "results' time of another shape": ("ladder/results.json", '{"claims": [], "time": [86]}')}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_committed_record_is_one_line_and_every_command_still_parses_its_flags(
        damage, tmp_path, monkeypatch, capsys):
    """--help's durations read docs/results as the parser is built: a damaged file there made every command
    crash before parsing its own arguments (TypeError, AttributeError). Now: one note, the flags parsed."""
    from experiments import ladder
    from experiments.all import parse
    from experiments.harness import committed
    where, text = DAMAGE[damage]
    (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / where).write_text(text)
    monkeypatch.setattr(committed, "RESULTS", tmp_path)
    monkeypatch.setattr(committed, "SMOKE", tmp_path / "smoke_times.json")
    args = ladder.EXPERIMENT.parser().parse_args(["--preset", "smoke", "--rows", "no_context"])
    assert (args.preset, args.rows) == ("smoke", "no_context")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("note: ") and str(tmp_path / where) in err[0], err
    assert ("--take-smoke" if "smoke" in where else "--take") in err[0] and "git checkout" in err[0]
    with pytest.raises(SystemExit) as helped:
        ladder.EXPERIMENT.parser().parse_args(["--help"])
    assert helped.value.code == 0 and "--preset" in capsys.readouterr().out
    assert parse(["--only", "averaging"])[1] == ["averaging"]          # experiments.all's own flags, too
