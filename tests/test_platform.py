"""harness.platform: the warning for a GPU/TPU plugin that JAX did not use, and the backend summary."""
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys

import pytest

from experiments.harness import platform

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def installed(monkeypatch):
    """Pretend these distributions (name -> version) are installed, on top of the real ones for
    jax and jaxlib; plugin modules are found only as the test says."""
    real_version = importlib.metadata.version

    def setup(versions: dict, modules: tuple = ()):
        def version(name):
            if name in versions:
                if versions[name] is None:
                    raise importlib.metadata.PackageNotFoundError(name)
                return versions[name]
            if name in platform.PLUGIN_DISTRIBUTIONS:      # no real plugin leaks in from this machine
                raise importlib.metadata.PackageNotFoundError(name)
            return real_version(name)
        monkeypatch.setattr(importlib.metadata, "version", version)
        monkeypatch.setattr(platform, "_module_found", lambda module: module in modules)
        monkeypatch.setattr(platform, "_platforms_requested", lambda: "")
    return setup


COLAB_AFTER_PLAIN_PIP = {"jax": "0.10.2", "jaxlib": "0.10.2",
                         "jax-cuda12-plugin": "0.7.2", "jax-cuda12-pjrt": "0.7.2"}


def test_stale_cuda_plugin_on_cpu_warns_loudly_with_versions_and_fix(installed):
    installed(COLAB_AFTER_PLAIN_PIP)
    warning = platform.check_backend("cpu")
    assert warning is not None and "\n" not in warning
    assert warning.startswith("WARNING: JAX IS RUNNING ON THE CPU")
    for found in ("jax 0.10.2", "jaxlib 0.10.2", "jax-cuda12-plugin 0.7.2", "jax-cuda12-pjrt 0.7.2"):
        assert found in warning
    assert "differs from jaxlib's" in warning
    assert "This run would be on the CPU" in warning
    assert f'pip install -U "jax[cuda12]" "attention_jax[gpu] @ git+{platform.REPO_URL}"' in warning
    assert "ONE pip command" in warning


def test_default_backend_is_asked_of_jax(installed):
    """No backend given: jax.default_backend() decides, and on this machine that is the CPU."""
    import jax
    installed(COLAB_AFTER_PLAIN_PIP)
    assert jax.default_backend() == "cpu"
    assert "jax-cuda12-plugin 0.7.2" in platform.check_backend()


@pytest.mark.parametrize("backend", ["gpu", "tpu"])
def test_no_warning_when_jax_uses_the_accelerator(installed, backend):
    installed({"jax-cuda12-plugin": "0.10.2", "jax-cuda12-pjrt": "0.10.2", "libtpu": "0.0.42.1"})
    assert platform.check_backend(backend) is None


def test_no_warning_without_a_plugin(installed):
    installed({})
    assert platform.plugin_versions() == {}
    assert platform.check_backend("cpu") is None


def test_no_warning_when_the_cpu_is_chosen(installed, monkeypatch):
    installed(COLAB_AFTER_PLAIN_PIP)
    monkeypatch.setattr(platform, "_platforms_requested", lambda: "cpu")
    assert platform.check_backend("cpu") is None


def test_matching_plugin_on_cpu_says_no_gpu_was_found(installed):
    jaxlib = importlib.metadata.version("jaxlib")
    installed({"jax-cuda12-plugin": jaxlib, "jax-cuda12-pjrt": jaxlib})
    warning = platform.check_backend("cpu")
    assert "The versions match, so JAX found no usable GPU" in warning
    assert "attention_jax[gpu]" in warning


def test_plugin_module_without_distribution_is_found(installed):
    installed({}, modules=("jax_plugins.xla_cuda12",))
    assert platform.plugin_versions() == {"jax-cuda12-pjrt": platform.UNKNOWN}
    assert "jax-cuda12-pjrt unknown" in platform.check_backend("cpu")


def test_stale_libtpu_on_cpu_points_at_the_tpu_extra(installed):
    installed({"libtpu": "0.0.1"})
    warning = platform.check_backend("cpu")
    assert "A TPU PLUGIN IS INSTALLED" in warning and "libtpu 0.0.1" in warning
    assert f'pip install -U "jax[tpu]" "attention_jax[tpu] @ git+{platform.REPO_URL}"' in warning


def test_backend_summary_here_is_the_cpu():
    import jax
    summary = platform.backend_summary()
    assert summary["backend"] == "cpu"
    assert summary["device_count"] == jax.device_count() >= 1
    assert summary["device_kinds"] == ["cpu"]
    assert summary["jax"] == jax.__version__
    assert summary["jaxlib"] == importlib.metadata.version("jaxlib")
    assert summary["flax"] == importlib.metadata.version("flax")
    assert summary["python"] == sys.version.split()[0]
    assert isinstance(summary["plugins"], dict)
    assert json.loads(json.dumps(summary)) == summary          # goes into results.json as is
    assert platform.describe_backend(summary).startswith("backend: cpu (")
    assert summary["host"]["cores"] == os.cpu_count()
    assert f"; host: {platform.describe_host(summary['host'])}" in platform.describe_backend(summary)


@pytest.mark.parametrize("cpuinfo, units, said", [
    ("model name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n",
     ["AMX", "AVX512-BF16"], "Intel(R) Xeon(R) Processor, 3 cores, bfloat16 units: AMX, AVX512-BF16"),
    ("model name\t: AMD EPYC 7B12\nflags\t\t: fpu avx2 fma\n", [], "AMD EPYC 7B12, 3 cores, bfloat16 units: none"),
    ("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n", ["BF16"], None),
    ("", None, None),
])
def test_host_cpu_names_the_bfloat16_matrix_units(cpuinfo, units, said, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    cpu = platform.host_cpu(cpuinfo)
    assert cpu["bf16_units"] == units and cpu["cores"] == 3
    if said:
        assert platform.describe_host(cpu) == said
    if units is None:
        assert platform.describe_host(cpu).endswith("bfloat16 units: unknown")


def test_importing_platform_does_not_import_jax():
    code = ("import sys, experiments.harness.platform; "
            "print(sorted(m for m in ('jax', 'jaxlib', 'flax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("env, big_programs, arenas", [
    ({}, False, 1),                                  # one arena: a second one re-faults XLA's scratch area
    ({}, True, 2),                                   # the norms table: one arena fragments (12.4 GB vs 3.9)
    ({platform.ARENAS_ENV: "3"}, False, 3),          # the override wins either way
    ({platform.ARENAS_ENV: "1"}, True, 1),
    ({platform.ARENAS_ENV: " "}, True, 2),           # blank: the default
])
def test_malloc_arenas_are_one_unless_the_programs_are_big(monkeypatch, env, big_programs, arenas):
    monkeypatch.delenv(platform.ARENAS_ENV, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert platform.malloc_arenas(big_programs) == arenas


@pytest.mark.parametrize("value", ["junk", "0", "-2", "²", "99999999999999999999"])
def test_an_impossible_arena_count_is_one_clear_error_from_the_command_line(monkeypatch, capsys, value):
    """Not a number from 1 to 1024: one line and exit 2 (it was ignored, or a ctypes traceback)."""
    monkeypatch.setenv(platform.ARENAS_ENV, value)
    with pytest.raises(platform.ConfigError, match=platform.ARENAS_ENV):
        platform.malloc_arenas()
    import experiments.params
    from experiments.harness import cli
    monkeypatch.setattr(cli, "catch_interrupts", lambda: None)
    monkeypatch.setattr(sys, "argv", ["params", "--preset", "smoke"])
    assert experiments.params.EXPERIMENT.main() == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {platform.ARENAS_ENV}={value!r}") and "\n" not in err


def test_only_the_norms_table_declares_big_programs():
    import importlib
    names = ["ladder", "positions", "norms", "scale_ablation", "winograd", "inside_tiny_gpt", "throughput"]
    big = [n for n in names if importlib.import_module(f"experiments.{n}").EXPERIMENT.big_programs]
    assert big == ["norms"]


def test_mallopt_applies_here_and_can_be_turned_off(monkeypatch):
    code = "from experiments.harness.platform import apply_mallopt; print(apply_mallopt())"
    on = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    off = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, platform.MALLOPT_ENV: "0"})
    assert (on.stdout.strip(), off.stdout.strip()) == ("True", "False")


@pytest.mark.parametrize("name, big", [("norms", True), ("ladder", False)])
def test_a_command_line_run_tunes_malloc_for_its_programs(monkeypatch, name, big):
    """`python -m experiments.<name>` applies the tuning before anything else, with its own arena count."""
    import importlib

    from experiments.harness import cli, experiment
    asked = []
    monkeypatch.setattr(experiment, "apply_mallopt", lambda big_programs=False: asked.append(big_programs))
    monkeypatch.setattr(cli, "catch_interrupts", lambda: None)
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit):
        importlib.import_module(f"experiments.{name}").EXPERIMENT.main()
    assert asked == [big]


@pytest.mark.slow
@pytest.mark.parametrize("platforms", ["gpu", "foo"])
def test_a_backend_jax_cannot_start_is_one_clear_error(platforms, tmp_path):
    """JAX_PLATFORMS naming a backend this machine lacks: one line and exit 2, not JAX's traceback."""
    proc = subprocess.run([sys.executable, "-m", "experiments.params", "--preset", "smoke", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": platforms})
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    said = {"gpu": "error: JAX_PLATFORMS='gpu' asks for a GPU, but JAX has no GPU backend here",
            "foo": "error: JAX cannot start the backend JAX_PLATFORMS='foo'"}[platforms]
    assert len(err) == 1 and err[0].startswith(said), err
    assert "Traceback" not in proc.stderr and "unset JAX_PLATFORMS" in err[0] and "rocm" not in err[0]


def test_an_experiment_that_shares_the_accelerator_reserves_none_of_it_up_front(tmp_path, monkeypatch):
    """JAX reserves 75% of a GPU's memory when a process first looks for it: the throughput and
    complexity parents look before their children take turns on it, so they must not."""
    from experiments.harness.experiment import Experiment, Result
    from experiments import complexity, throughput
    assert throughput.EXPERIMENT.shares_accelerator and complexity.EXPERIMENT.shares_accelerator
    seen = {}

    def run(ctx):
        seen["preallocate"] = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")
        return Result(rows=[], claims=[], tables={})

    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "unset")   # so the test's end restores what was there
    for shares, want in ((False, None), (True, "false")):
        monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
        assert Experiment(f"probe{int(shares)}", "a probe", {"smoke": {}}, run, shares_accelerator=shares).main(
            ["--preset", "smoke", "--out", str(tmp_path)]) == 0
        assert seen["preallocate"] == want
    # experiments.all runs them in one process, which reserves at its first experiment: it sets it first
    from experiments import all as everything
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    monkeypatch.setattr(everything, "run_one", lambda name, args: seen.update(all=os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")))
    everything.main(["--preset", "smoke", "--only", "averaging,throughput", "--out", str(tmp_path)])
    assert seen["all"] == "false"


class FakeGpu:
    platform, client = "gpu", None

    def __init__(self, capability):
        self.compute_capability = capability


@pytest.mark.parametrize("devices, dtype, said", [
    ([FakeGpu("7.5")], "float16", "cuda (compute capability 7.5): tensor cores for float16 and none for bfloat16"),
    ([FakeGpu("8.0")], "bfloat16", "cuda (compute capability 8): bfloat16 tensor cores"),
    ("tpu", "bfloat16", "tpu: a TPU's matrix units multiply bfloat16"),
])
def test_the_first_line_names_the_dtype_a_gpu_or_tpu_should_train_in(devices, dtype, said):
    """A T4 (7.5) gets float16, an A100 (8.0) and a TPU bfloat16: said on the backend line, and kept in
    results.json; a CPU's line says nothing new."""
    summary = {**platform.backend_summary(), **platform.accelerator_dtype(devices)}
    assert summary["dtype"] == dtype and summary["dtype_why"].startswith(said), summary["dtype_why"]
    assert platform.describe_backend(summary).endswith(f"; train in --dtype {dtype} ({summary['dtype_why']})")
    assert platform.accelerator_dtype("cpu") == {} and "--dtype" not in platform.describe_backend()
