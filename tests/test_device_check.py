"""tools/device_check.sh: on a machine whose JAX does not see the accelerator asked for (this CPU) it
stops in its first seconds with one line and exit 3, before anything trains; its results folder is
made when it is not there yet (its logs had gone nowhere while the check said where its results
were), and one that cannot be made is refused in one line.

The check itself needs a GPU machine. `fake` stands in a `python3` that says it sees a GPU and fits
no flax, so the check goes one step further and stops at the flax check, after writing its log."""
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAKE = """#!/bin/sh
case "$2" in *default_backend*) echo "gpu Tesla T4"; exit 0;; esac
echo 'ModuleNotFoundError: no jax here' >&2
exit 1
"""


def check(tmp_path, out: pathlib.Path, *, fake: bool = True, **env) -> subprocess.CompletedProcess:
    """The check with OUT=out, and `python3` the fake one or this test's own (its jax, on this CPU)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "python3").write_text(FAKE if fake else f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (bin_ / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "OUT": str(out), **env}
    return subprocess.run(["bash", str(ROOT / "tools" / "device_check.sh")], env=env, capture_output=True,
                          text=True, timeout=120)


def test_on_a_cpu_the_check_stops_in_seconds_in_one_line_before_training(tmp_path):
    """A CUDA plugin that fails to load leaves JAX on the CPU: the check says so and stops, where it
    used to train the paper ladder on the CPU until the call's time limit."""
    began = time.perf_counter()
    done = check(tmp_path, tmp_path / "out", fake=False)
    took = time.perf_counter() - began
    assert done.returncode == 3, done.stdout + done.stderr
    assert took < 30, took
    err = done.stderr.strip()
    assert done.stdout == "" and len(err.splitlines()) == 1, done.stdout + done.stderr
    assert err.startswith("error: JAX runs on cpu here, not the gpu asked for") and "EXPECT=cpu" in err
    assert (tmp_path / "out" / "versions.log").read_text().strip() == err
    # A TPU asked for is refused alike; the CPU asked for passes this check (and goes on: not run here).
    assert "not the tpu asked for" in check(tmp_path, tmp_path / "tpu", fake=False, EXPECT="tpu").stderr


def test_an_output_folder_that_is_not_there_yet_is_made_and_holds_what_the_check_wrote(tmp_path):
    out = tmp_path / "not" / "there" / "yet"
    done = check(tmp_path, out)
    assert done.returncode == 2, done.stdout + done.stderr           # stopped at the flax check, as arranged
    log = (out / "versions.log").read_text()
    assert log.startswith("JAX sees the gpu asked for: Tesla T4") and "no flax here fits" in log
    assert "results in" not in done.stdout + done.stderr


def test_an_output_folder_that_cannot_be_made_is_refused_in_one_line(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    done = check(tmp_path, blocker / "out")
    assert done.returncode == 2
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and "OUT=" in err, err
    assert done.stdout == ""
