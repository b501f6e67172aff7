"""tools/device_check.sh's results folder: one that is not there yet is made (its logs had gone nowhere
while the check said where its results were), one that cannot be made is refused in one line.

The check itself needs a GPU machine; here its first step stops it early, on purpose: a `python3`
on PATH that fits no jax, so the flax check fails in a second, after writing its log into OUT."""
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]


def check(tmp_path, out: pathlib.Path) -> subprocess.CompletedProcess:
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "python3").write_text("#!/bin/sh\necho 'ModuleNotFoundError: no jax here' >&2\nexit 1\n")
    (bin_ / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "OUT": str(out)}
    return subprocess.run(["bash", str(ROOT / "tools" / "device_check.sh")], env=env, capture_output=True,
                          text=True, timeout=60)


def test_an_output_folder_that_is_not_there_yet_is_made_and_holds_what_the_check_wrote(tmp_path):
    out = tmp_path / "not" / "there" / "yet"
    done = check(tmp_path, out)
    assert done.returncode == 2, done.stdout + done.stderr           # stopped at the flax check, as arranged
    assert "no flax here fits" in (out / "versions.log").read_text()
    assert "results in" not in done.stdout + done.stderr


def test_an_output_folder_that_cannot_be_made_is_refused_in_one_line(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    done = check(tmp_path, blocker / "out")
    assert done.returncode == 2
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and "OUT=" in err, err
    assert done.stdout == ""
