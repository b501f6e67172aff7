"""What this machine is: the accelerator JAX found, and a malloc tuned for XLA on a CPU.

`accelerator()` picks the default preset (paper on a GPU/TPU, cpu otherwise);
`accelerator_dtype()` names the compute dtype a GPU or TPU should train in (float16 on a T4,
bfloat16 from compute capability 8.0 and on a TPU) for the first line to say.
`check_backend()` is a loud warning (or None) when a GPU/TPU plugin is installed but JAX runs
on the CPU (a jax upgraded without its plugin: jaxlib refuses the plugin and falls back
without an error). `backend_summary()` is what JAX runs on, with the versions, for
experiments to print and record in results.json.

`apply_mallopt()` keeps freed memory in the process: glibc gives allocations above 32 MB back
on free, so XLA's CPU scratch area would be paged in anew every training step. One glibc
arena, except for an experiment that declares `big_programs` (two): a second arena's heaps
cannot hold that scratch area, while one arena fragments on the twelve-block programs.
`ATTENTION_JAX_ARENAS=N` overrides both; docs/performance.md ("Memory: glibc's arenas") has
the figures and the commands that measured them. Only glibc's malloc is tuned.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import importlib.util
import os
import re
import sys

from attention_jax.errors import ConfigError

REPO_URL = "https://github.com/attention-jax/attention_jax"
MALLOPT_ENV = "ATTENTION_JAX_MALLOPT"   # "0" turns the tuning off
# (M_MMAP_MAX, M_TRIM_THRESHOLD, M_TOP_PAD) and M_ARENA_MAX; mallopt takes a C int.
MALLOPT_SETTINGS = ((-4, 0), (-1, 2**31 - 1), (-2, 64 << 20))
M_ARENA_MAX = -8
ARENAS_ENV = "ATTENTION_JAX_ARENAS"     # a positive number overrides malloc_arenas()


def malloc_arenas(big_programs: bool = False) -> int:
    """glibc arenas for XLA: one (fast, see above), two for big programs that fragment one arena."""
    asked = os.environ.get(ARENAS_ENV, "").strip()
    if not asked:
        return 2 if big_programs else 1
    try:
        value = int(asked)
    except ValueError:
        value = 0
    if not 1 <= value <= 1024:      # mallopt takes a C int; more arenas than that helps nobody
        raise ConfigError(f"{ARENAS_ENV}={asked!r} must be a whole number from 1 to 1024 (glibc malloc arenas), "
                          "or unset for the default")
    return value


def apply_mallopt(big_programs: bool = False) -> bool:
    """Tune glibc malloc in this process; best before the first computation starts threads."""
    if os.environ.get(MALLOPT_ENV) == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        settings = ((M_ARENA_MAX, malloc_arenas(big_programs)), *MALLOPT_SETTINGS)
        return all(libc.mallopt(param, value) == 1 for param, value in settings)
    except (OSError, AttributeError):   # not glibc: nothing to tune
        return False


@contextlib.contextmanager
def backend_errors():
    """JAX failing to start the backend `JAX_PLATFORMS` names (an unknown name, a GPU without its
    plugin), as one line instead of JAX's RuntimeError from deep inside the first computation."""
    try:
        yield
    except RuntimeError as e:
        text = " ".join(str(e).split())
        if not text.startswith("Unable to initialize backend"):
            raise
        asked = os.environ.get("JAX_PLATFORMS", "")
        if asked.strip().lower() in ("gpu", "cuda", "rocm", "tpu"):   # JAX's own text names whichever it tried last
            kind = "tpu" if asked.strip().lower() == "tpu" else "gpu"
            raise ConfigError(f"JAX_PLATFORMS={asked!r} asks for a {kind.upper()}, but JAX has no {kind.upper()} backend "
                              f"here (no plugin installed, or none of its devices found); unset JAX_PLATFORMS to run on "
                              f"what this machine has, or install the project with its {kind} extra: pip install "
                              f"\"attention_jax[{kind}] @ git+{REPO_URL}\" (docs/install.md)") from None
        raise ConfigError(f"JAX cannot start the backend{f' JAX_PLATFORMS={asked!r} asks for' if asked else ''}: "
                          f"{text.split(' (set JAX_PLATFORMS')[0].rstrip('.')}; unset JAX_PLATFORMS to run on what this "
                          "machine has, or install that backend's plugin with the project (docs/install.md)") from None


def accelerator() -> str | None:
    """'gpu' or 'tpu' when JAX sees one, else None (imports JAX: call it only when needed)."""
    import jax
    backend = jax.default_backend()
    return backend if backend in ("gpu", "tpu", "cuda", "rocm") else None


# Accelerator plugin distributions -> the backend each one brings and the extra that keeps
# it matched to jax (jax's own cuda12/cuda13 extras pin the plugin to jax's exact version,
# its tpu extra pins libtpu).
PLUGIN_DISTRIBUTIONS = {
    "jax-cuda12-plugin": ("gpu", "cuda12"),
    "jax-cuda12-pjrt": ("gpu", "cuda12"),
    "jax-cuda13-plugin": ("gpu", "cuda13"),
    "jax-cuda13-pjrt": ("gpu", "cuda13"),
    "libtpu": ("tpu", "tpu"),
    "libtpu-nightly": ("tpu", "tpu"),
}
# The same plugins by module, for a copy installed without distribution metadata.
PLUGIN_MODULES = {
    "jax_cuda12_plugin": "jax-cuda12-plugin",
    "jax_plugins.xla_cuda12": "jax-cuda12-pjrt",
    "jax_cuda13_plugin": "jax-cuda13-plugin",
    "jax_plugins.xla_cuda13": "jax-cuda13-pjrt",
    "libtpu": "libtpu",
}
UNKNOWN = "unknown"   # a plugin module found, but no distribution to tell its version


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _module_found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # parent package missing, or a broken install
        return False


def plugin_versions() -> dict[str, str]:
    """The GPU/TPU plugins installed, distribution name -> version ('unknown' if only its module is)."""
    found = {name: v for name in PLUGIN_DISTRIBUTIONS if (v := _version(name)) is not None}
    for module, name in PLUGIN_MODULES.items():
        if name not in found and _module_found(module):
            found[name] = UNKNOWN
    return found


def _default_backend() -> str:
    import jax
    return jax.default_backend()


def _platforms_requested() -> str:
    """JAX_PLATFORMS as JAX reads it ('' when unset): 'cpu' there is a choice, not a fallback."""
    import jax
    return (getattr(jax.config, "jax_platforms", None) or os.environ.get("JAX_PLATFORMS") or "").strip()


def _expected_libtpu() -> str | None:
    """The libtpu release that the installed jax's tpu extra pins (e.g. '0.0.42'), if it says."""
    for req in importlib.metadata.requires("jax") or []:
        m = re.match(r"libtpu\s*==\s*([0-9][0-9.]*?)(?:\.\*)?\s*;.*extra\s*==\s*['\"]tpu['\"]", req)
        if m:
            return m.group(1)
    return None


def check_backend(backend: str | None = None) -> str | None:
    """A loud one-paragraph warning when a GPU/TPU plugin is installed but JAX's backend is the CPU, else None.

    `backend` defaults to `jax.default_backend()` (imports JAX). A CPU chosen on purpose
    (JAX_PLATFORMS=cpu) is not warned about.
    """
    plugins = plugin_versions()
    if not plugins:
        return None
    backend = backend if backend is not None else _default_backend()
    if backend != "cpu" or _platforms_requested().lower() == "cpu":
        return None
    jax_v, jaxlib_v = _version("jax"), _version("jaxlib")
    kinds = {PLUGIN_DISTRIBUTIONS[name][0] for name in plugins}
    kind = "gpu" if "gpu" in kinds else "tpu"
    extra = next(PLUGIN_DISTRIBUTIONS[n][1] for n in plugins if PLUGIN_DISTRIBUTIONS[n][0] == kind)
    found = ", ".join([f"jax {jax_v or 'not installed'}", f"jaxlib {jaxlib_v or 'not installed'}"]
                      + [f"{name} {v}" for name, v in plugins.items()])
    if kind == "gpu":
        stale = [n for n, v in plugins.items() if PLUGIN_DISTRIBUTIONS[n][0] == "gpu" and v not in (jaxlib_v, UNKNOWN)]
    else:
        want = _expected_libtpu()
        stale = [n for n, v in plugins.items() if n == "libtpu" and want and v != want and not v.startswith(want + ".")]
    if stale:
        why = (f"The plugin's version differs from jaxlib's ({', '.join(stale)} vs jaxlib {jaxlib_v}), so jaxlib "
               "refused it and fell back to the CPU without an error: this is what upgrading jax alone does "
               "(Colab ships jax 0.7 with its plugin; this project needs jax >= 0.10).")
    else:
        why = (f"The versions match, so JAX found no usable {kind.upper()}: is this runtime's accelerator "
               "attached (Colab: Runtime > Change runtime type) and its driver visible? JAX's own log "
               "line above says why it fell back.")
    return (f"WARNING: JAX IS RUNNING ON THE CPU, BUT A {kind.upper()} PLUGIN IS INSTALLED ({found}). "
            f"{why} This run would be on the CPU, far slower than on the {kind.upper()}, and the default "
            f"preset would be the cpu one. Fix: {'' if stale else f'use a {kind.upper()} runtime; if this is one, '}"
            "install the project and a matching jax in ONE pip command, "
            f'pip install -U "jax[{extra}]" "attention_jax[{kind}] @ git+{REPO_URL}" '
            f"(for a checkout: pip install -U \"jax[{extra}]\" -e \".[{kind}]\"), then restart the "
            "runtime/Python so the new jax is the one imported. Set JAX_PLATFORMS=cpu to run on the CPU on purpose.")


def host_cpu(cpuinfo: str | None = None) -> dict:
    """The host's processor: model, cores, and its bfloat16 matrix units (AMX, AVX512-BF16).

    bfloat16's speed on a CPU turns on those units (docs/performance.md). Linux's /proc/cpuinfo;
    elsewhere the model is Python's `platform.processor()` and the units are unknown (None).
    """
    import platform as std_platform
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", cpuinfo, re.M)
    flags = set(flags.group(1).split()) if flags else None
    units = None if flags is None else [u for f, u in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"),
                                                       ("bf16", "BF16")) if f in flags]
    return {"model": model.group(1).strip() if model else (std_platform.processor() or "unknown"),
            "cores": os.cpu_count(), "bf16_units": units}


def describe_host(cpu: dict) -> str:
    """host_cpu() in words, e.g. 'Intel(R) Xeon(R) Processor, 2 cores, bfloat16 units: AMX, AVX512-BF16'."""
    units = cpu.get("bf16_units")
    said = "unknown" if units is None else (", ".join(units) or "none")
    return f"{cpu['model']}, {cpu['cores']} cores, bfloat16 units: {said}"


def backend_summary() -> dict:
    """What JAX runs on, with versions: for experiments to print and record in results.json (imports JAX)."""
    import jax

    from experiments.harness import compile_cache
    devices = jax.devices()
    return {
        "backend": jax.default_backend(),
        "device_count": len(devices),
        "device_kinds": sorted({d.device_kind for d in devices}),
        "python": sys.version.split()[0],
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "flax": _version("flax"),
        "plugins": plugin_versions(),
        "host": host_cpu(),
        "compile_cache": compile_cache.in_use(),
        "warning": check_backend(jax.default_backend()),
        **accelerator_dtype(devices),
    }


def accelerator_dtype(devices) -> dict:
    """On a GPU or TPU, the compute dtype its training should get and why (`speed.dtype_for`):
    {"dtype": ..., "dtype_why": ...}, for the first line to name; {} on a CPU, whose line says
    nothing new."""
    from attention_jax.speed import backend_of, dtype_for
    backend = backend_of(devices)
    if backend.cpu:
        return {}
    dtype, why = dtype_for(backend)
    return {"dtype": dtype, "dtype_why": f"{backend}: {why}"}


def describe_backend(summary: dict | None = None) -> str:
    """backend_summary() as one line, e.g. 'backend: cpu (1 x cpu), jax 0.10.2, jaxlib 0.10.2, flax 0.12.8,
    no plugin; host: Intel(R) Xeon(R) Processor, 2 cores, bfloat16 units: AMX, AVX512-BF16'."""
    s = summary if summary is not None else backend_summary()
    plugins = ", ".join(f"{n} {v}" for n, v in s["plugins"].items()) or "no plugin"
    host = f"; host: {describe_host(s['host'])}" if s.get("host") else ""
    dtype = f"; train in --dtype {s['dtype']} ({s['dtype_why']})" if s.get("dtype") else ""
    return (f"backend: {s['backend']} ({s['device_count']} x {', '.join(s['device_kinds'])}), "
            f"jax {s['jax']}, jaxlib {s['jaxlib']}, flax {s['flax']}, {plugins}{host}{dtype}")
