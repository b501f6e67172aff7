"""What runs on a GPU or a TPU, proven on this CPU: every program the library compiles (`PROGRAMS`,
by name; a new one without a lowering here fails `test_every_compiled_program_is_listed`) lowers
for cuda and for tpu (`jax.export`), holding cuDNN's attention exactly where `Speed.describe` says
so (float16 and bfloat16 at compute capability 8.0, never at 7.5 nor in float32) and no CPU-only
branch; and the accelerator branches, run here, equal the CPU's (these run in the fast tier, so
in CI's newest-jax leg too).

A CPU cannot check that XLA's GPU compiler, cuDNN and libtpu accept these programs, their numbers
there, or their speed (docs/install.md says so); the device check (tools/device_check.sh) does,
when a GPU is lent. A float16 program built for a GPU or TPU cannot run here: its attention asks
for a float16 product with a float32 result, which XLA's CPU backend has not.
"""

import ast
import dataclasses
import functools
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import export

from attention_jax.analysis import attribution, discovery, faithfulness, patching
from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.decoding import layout, loops as decode
from attention_jax.decoding import generate
from attention_jax.decoding.generate import Decoder
from attention_jax.model import LanguageModel
from attention_jax.speed import Speed
from attention_jax.speed.backend import Backend
from attention_jax.train import Engine
from experiments.configs import LADDER

ROOT = pathlib.Path(__file__).resolve().parents[1]
CUDNN = ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward")
# Named scopes the library puts around what only a CPU should run: the cuda and tpu programs hold none.
CPU_ONLY = ("cpu_only", "attention_causal_halves")
PLATFORMS = ("cuda", "tpu")
DTYPES = ("float32", "bfloat16", "float16")
TC = TrainConfig(batch_size=4)
SMALL = ModelConfig(vocab_size=64, context=16, d_model=32, n_layers=2, n_heads=4)


def exported(fn, platform, *args, **kwargs) -> export.Exported:
    """`fn` (a jit-compiled function) exported for `platform` (a name or a `Backend`'s)."""
    return export.export(fn, platforms=(platform,),
                         disabled_checks=[export.DisabledSafetyCheck.custom_call(c) for c in CUDNN]
                         )(*args, **kwargs)


def lowered(fn, platform: str, *args, **kwargs) -> str:
    """`fn` exported for `platform`: its StableHLO text, locations included."""
    return exported(fn, platform, *args, **kwargs).mlir_module()


def custom_calls(text: str) -> set[str]:
    return set(re.findall(r"custom_call @([\w$.]+)", text))


def check(text: str, platform: str, *, cudnn: bool, fused: bool) -> None:
    """No CPU-only branch; cuDNN's attention forward and backward exactly when `cudnn`; the fused form
    (XLA's kernel or cuDNN's) exactly when the model has attention (`fused`)."""
    assert platform != "cpu"
    assert not [name for name in CPU_ONLY if name in text], f"a CPU-only branch in the {platform} program"
    calls = custom_calls(text)
    assert (set(CUDNN) <= calls) == cudnn and (not calls & set(CUDNN)) == (not cudnn), calls
    assert ("attention_fused" in text) == fused


def step_args(engine: Engine, n_seeds: int = 1):
    state = engine.abstract_state(list(range(n_seeds)))
    lead = (n_seeds,) if n_seeds > 1 else ()
    x = jax.ShapeDtypeStruct((*lead, TC.batch_size, engine.model_config.context), jnp.int32)
    return state, {"x": x, "y": x}


# --- every compiled program, by name ---------------------------------------------------------

def _jit_decorated(tree) -> list[str]:
    """Functions decorated with jax.jit (or functools.partial(jax.jit, ...))."""
    def jit(node):
        text = ast.unparse(node)
        return text == "jax.jit" or text.startswith(("functools.partial(jax.jit", "partial(jax.jit"))
    return [f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and any(map(jit, f.decorator_list))]


def _jit_calls(tree) -> int:
    """jax.jit(...) called on a function (not as a decorator)."""
    return sum(isinstance(n, ast.Call) and ast.unparse(n.func) == "jax.jit" and bool(n.args) for n in ast.walk(tree))


def library_programs() -> set[str]:
    """Every program the library jit-compiles: `module.function` for a decorated function, and the
    Engine's five (`Engine._compile` jits them in place: `jax.jit(...)` in engine.py alone)."""
    found, called = set(), {}
    for path in sorted((ROOT / "attention_jax").rglob("*.py")):
        tree = ast.parse(path.read_text())
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found |= {f"{module}.{name}" for name in _jit_decorated(tree)}
        if _jit_calls(tree):
            called[module] = _jit_calls(tree)
    assert called == {"attention_jax.train.engine": 5}, called
    return found | {f"Engine.{name}" for name in ("_init", "_step", "_steps", "_nll", "_logits")}


def _metric(logits):
    return patching.logit_diff(logits, 1, 2)


@functools.lru_cache(maxsize=None)
def _setup():
    """The discovery setup every analysis program is built from: SMALL's model, two texts, a metric."""
    model = LanguageModel(SMALL, rngs=nnx.Rngs(0))
    tokens = np.arange(32, dtype=np.int32).reshape(2, 16) % SMALL.vocab_size
    return model, discovery.prepare(model, tokens, (tokens + 1) % SMALL.vocab_size, _metric)


def _engine(platform):
    engine = Engine(dataclasses.replace(SMALL, dtype="bfloat16"), TC, backend=platform)
    state, batch = step_args(engine)
    windows = jax.ShapeDtypeStruct((8, SMALL.context), jnp.int32)
    return engine, state, batch, windows


def _engine_program(name):
    def build(platform):
        engine, state, batch, windows = _engine(platform)
        steps = {k: jax.ShapeDtypeStruct((16, *v.shape), v.dtype) for k, v in batch.items()}
        args = {"_step": (state, batch), "_steps": (state, steps), "_nll": (state, windows, windows, None),
                "_logits": (state, windows)}[name]
        return getattr(engine, name), args, {}
    return build


def _decoding(name):
    def build(platform):
        decoder = Decoder(LanguageModel(SMALL, rngs=nnx.Rngs(0)), backend=platform)
        B, P, key, one = 2, 5, jax.random.key(0), jnp.float32(1.0)
        graph, empty, rest = decode.cached_model(decoder.graphdef, decoder.state, B, P + 3)
        prompt, padding = jnp.zeros((B, P), jnp.int32), jnp.zeros((B,), jnp.int32)
        cache, logits = jax.eval_shape(lambda: decode.prefill(graph, rest, empty, prompt, padding))
        leaves, tree = jax.tree.flatten(empty)
        options = {"greedy": True, "top_k": None}
        return {
            "_zeros": (decode._zeros, ((tree, tuple((a.shape, jnp.dtype(a.dtype)) for a in leaves)),), {}),
            "prefill": (decode.prefill, (graph, rest, empty, prompt, padding), {}),
            "extend": (decode.extend, (graph, rest, cache, logits, key, one, jnp.zeros((B, 4), jnp.int32), 0, 3),
                       options),
            "last": (decode.last, (logits, key, one), options),
            "_windows": (decode._windows, (decode.Graph(decoder.graphdef), decoder.state,
                                           jnp.zeros((B, 24), jnp.int32), jnp.array([5, 3], jnp.int32), key, one,
                                           0, 4), options),
        }[name]
    return build


def _analysis(name):
    def build(platform):
        model, at = _setup()
        names = tuple(f"blocks.{i}.mixer.z" for i in range(SMALL.n_layers))
        hooks = patching.hook_values(at.graphdef, at.state, at.tokens, names=names)
        zeros = {n: jnp.zeros_like(v) for n, v in hooks.items()}
        static = {"graph": at.graph, "metric": at.metric}
        mine = discovery.recorded(at, at.tokens)
        ends = {"blocks.0.resid_pre": (jnp.zeros((2, 16, SMALL.d_model)),) * 2}
        masks = np.stack([at.graph.mask([]), at.graph.mask([0, 1])]).astype(np.float32)
        common = (at.graphdef, at.state, at.tokens)
        return {
            "discovery._recorded": (discovery._recorded, common, {}),
            "discovery._patched": (discovery._patched, (*common, at.others, masks), static),   # ACDC's, paths'
            "discovery._one_edge": (discovery._one_edge, (*common, at.others, mine, np.zeros((3, 2), np.int32)),
                                    {**static, "start": 1}),
            "patching.hook_values": (patching.hook_values, common, {"names": names}),
            "patching._sweep": (patching._sweep, (*common, hooks, np.zeros((4, 2), np.int32)),
                                {"names": names, "axes": patching.HOOKS["z"][1], "by": "head", "metric": at.metric}),
            "patching._hook_gradients": (patching._hook_gradients, (*common, zeros),
                                         {"names": names, "metric": at.metric}),
            "attribution._mask_gradients": (attribution._mask_gradients, (*common, at.others, jnp.zeros(2)),
                                            static),                         # EAP, mask IG
            "attribution._moved_gradients": (attribution._moved_gradients,
                                             (*common, at.others - mine.senders, ends, jnp.zeros(3, jnp.int32),
                                              jnp.linspace(0, 1, 3)), {**static, "names": tuple(ends)}),   # EAP-IG
            "faithfulness._ends": (faithfulness._ends, (*common, at.others), {"graph": at.graph}),
        }[name]
    return build


def _small(name):
    def build(platform):
        w = jnp.asarray(np.random.default_rng(0).standard_normal((48, 64)), jnp.float32)
        params = nnx.state(LanguageModel(SMALL, rngs=nnx.Rngs(0)), nnx.Param)
        return {"layout.quantized": (layout.quantized, (w,), {}),
                "generate._finite": (generate._finite, (params,), {})}[name]
    return build


PROGRAMS = {
    **{f"Engine.{n}": _engine_program(n) for n in ("_step", "_steps", "_nll", "_logits")},
    **{f"attention_jax.decoding.loops.{n}": _decoding(n) for n in ("_zeros", "prefill", "extend", "last", "_windows")},
    **{f"attention_jax.analysis.{n}": _analysis(n) for n in (
        "discovery._recorded", "discovery._patched", "discovery._one_edge", "patching.hook_values",
        "patching._sweep", "patching._hook_gradients", "attribution._mask_gradients",
        "attribution._moved_gradients", "faithfulness._ends")},
    **{f"attention_jax.decoding.{n}": _small(n) for n in ("layout.quantized", "generate._finite")},
}
# Compiled only over a mesh (one device initialises op by op): lowered by the mesh test below.
ELSEWHERE = {"Engine._init": "test_a_step_over_an_8_device_mesh_lowers_for_tpu"}


def test_every_compiled_program_is_listed():
    """A program the library compiles that this file does not lower fails here, by name."""
    assert set(PROGRAMS) | set(ELSEWHERE) == library_programs()


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_compiled_program_lowers(name, platform, cudnn):
    """Exported for the platform: its outputs those the CPU traces, no CPU-only branch, and cuDNN's
    attention only in the bfloat16 engine's programs on cuda (the analysis and decoding programs run
    the float32 model: XLA's)."""
    fn, args, kwargs = PROGRAMS[name](platform)
    done = exported(fn, platform, *args, **kwargs)
    assert done.platforms == (platform,)
    want = jax.tree.leaves(fn.eval_shape(*args, **kwargs))       # static arguments as jit takes them
    assert [(a.shape, a.dtype) for a in done.out_avals] == [(w.shape, w.dtype) for w in want]
    text = done.mlir_module()
    assert not [n for n in CPU_ONLY if n in text], f"a CPU-only branch in {name} for {platform}"
    engine = name.startswith("Engine.")
    assert ("__cudnn$fmhaSoftmax" in custom_calls(text)) == (engine and platform == "cuda")
    assert ("__cudnn$fmhaSoftmaxBackward" in custom_calls(text)) == (
        name in ("Engine._step", "Engine._steps") and platform == "cuda")


# --- the training step of every ladder row, every dtype --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row", LADDER, ids=lambda r: r.name)
def test_every_ladder_row_trains_on_cuda_and_tpu_with_cudnn_where_described(row, dtype, cudnn):
    config = dataclasses.replace(row.config, dtype=dtype)
    for platform in PLATFORMS:
        said = Speed().describe(config, platform)
        engine = Engine(config, TC, backend=platform)
        text = lowered(engine._step, platform, *step_args(engine))
        check(text, platform, cudnn=said == "fused (cuDNN)", fused=config.heads_used > 0)
        # float16's step scales its loss and checks its gradients (train.loss_scale); no other does.
        assert ("scaled_loss" in text) == (dtype == "float16")
    # On cuda, cuDNN for every half-precision row with heads (head dims 32 and 128), never for float32.
    assert (Speed().describe(config, "cuda") == "fused (cuDNN)") == (dtype != "float32" and config.heads_used > 0)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row", LADDER, ids=lambda r: r.name)
def test_every_ladder_row_trains_two_seeds_on_cuda_and_tpu(row, dtype, cudnn):
    config = dataclasses.replace(row.config, dtype=dtype)
    for platform in PLATFORMS:
        engine = Engine(config, TC, n_seeds=2, backend=platform)
        check(lowered(engine._step, platform, *step_args(engine, 2)), platform,
              cudnn=Speed().describe(config, platform) == "fused (cuDNN)", fused=config.heads_used > 0)


def test_two_seeds_lower_as_one_does(cudnn):
    """The seeds' vmap of one block (every row and dtype: the slow test above)."""
    config = dataclasses.replace(LADDER[-1].config, dtype="float16")
    for platform in PLATFORMS:
        engine = Engine(config, TC, n_seeds=2, backend=platform)
        text = lowered(engine._step, platform, *step_args(engine, 2))
        check(text, platform, cudnn=platform == "cuda", fused=True)
        assert "scaled_loss" in text


def test_the_checks_would_see_a_cpu_program():
    """The CPU's program of a bfloat16 block holds both CPU-only names, so their absence above means something."""
    config = dataclasses.replace(LADDER[-1].config, dtype="bfloat16")
    engine = Engine(config, TC, backend="cpu")
    text = lowered(engine._step, "cpu", *step_args(engine))
    assert all(name in text for name in CPU_ONLY) and "attention_fused" not in text


@pytest.mark.parametrize("capability, dtype", [(7.5, "bfloat16"), (7.5, "float16"), (9.0, "float32")])
def test_a_t4_or_float32_gets_xla_s_kernel_and_says_why(capability, dtype, cudnn):
    config = dataclasses.replace(LADDER[-1].config, dtype=dtype)
    gpu = Backend("cuda", capability)
    engine = Engine(config, TC, backend=gpu)
    check(lowered(engine._step, "cuda", *step_args(engine)), "cuda", cudnn=False, fused=True)
    assert Speed().describe(config, gpu).startswith("fused (XLA's kernel; cuDNN's flash attention ")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_compute_capability_8_gets_cudnn_in_half_precision(dtype, cudnn):
    """An A100 (8.0): cuDNN's flash attention forward and backward, float16 as bfloat16."""
    config = dataclasses.replace(LADDER[-1].config, dtype=dtype)
    gpu = Backend("cuda", 8.0)
    engine = Engine(config, TC, backend=gpu)
    check(lowered(engine._step, "cuda", *step_args(engine)), "cuda", cudnn=True, fused=True)
    assert Speed().describe(config, gpu) == "fused (cuDNN)"


@pytest.mark.parametrize("weights", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("platform", PLATFORMS)
def test_cached_decoding_lowers_for_one_row_and_four_unequal(platform, weights):
    decoder = Decoder(LanguageModel(SMALL, rngs=nnx.Rngs(0)), weights=weights, backend=platform)
    for lengths in ([5], [5, 3, 4, 1]):
        for text in decoding(decoder, platform, lengths):
            assert not [n for n in CPU_ONLY if n in text]
    # The CPU's one-row product is what the check would see: it is there in the CPU's program.
    cpu = Decoder(LanguageModel(SMALL, rngs=nnx.Rngs(0)), weights=weights, backend="cpu")
    assert "cpu_only" in decoding(cpu, "cpu", [5])[1]


def decoding(decoder, platform: str, lengths: list[int]) -> tuple[str, str]:
    """The prefill and the chunk of new tokens of cached decoding, exported for `platform`."""
    B, P = len(lengths), max(lengths)
    prompt, padding = jnp.zeros((B, P), jnp.int32), jnp.asarray(P - np.array(lengths), jnp.int32)
    graph, empty, rest = decode.cached_model(decoder.graphdef, decoder.state, B, P + 3)
    prefill = lowered(decode.prefill, platform, graph, rest, empty, prompt, padding)
    cache, logits = jax.eval_shape(lambda: decode.prefill(graph, rest, empty, prompt, padding))
    extend = lowered(decode.extend, platform, graph, rest, cache, logits, jax.random.key(0), jnp.float32(1.0),
                     jnp.zeros((B, 4), jnp.int32), 0, 3, greedy=True, top_k=None)
    return prefill, extend


MESH_SCRIPT = """
import dataclasses, jax, jax.numpy as jnp
from jax import export
from attention_jax.train import Engine, TrainConfig
from experiments.configs import LADDER
assert jax.device_count() == 8, jax.devices()
config = dataclasses.replace(LADDER[-1].config, dtype="bfloat16")
engine = Engine(config, TrainConfig(batch_size=16), backend="tpu")
init = export.export(engine._init, platforms=("tpu",))(jax.ShapeDtypeStruct((), jax.random.key(0).dtype))
state = engine.abstract_state([0])
x = jax.ShapeDtypeStruct((16, config.context), jnp.int32, sharding=engine.mesh and
                         jax.sharding.NamedSharding(engine.mesh, jax.sharding.PartitionSpec("data")))
exported = export.export(engine._step, platforms=("tpu",))(state, {"x": x, "y": x})
text = exported.mlir_module()
print(exported.nr_devices, init.nr_devices, "attention_fused" in text, "cpu_only" in text,
      "attention_causal_halves" in text)
"""


def test_a_step_over_an_8_device_mesh_lowers_for_tpu():
    """The step and the initialisation (compiled only over a mesh) for eight TPU devices."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
    out = subprocess.run([sys.executable, "-c", MESH_SCRIPT], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["8", "8", "True", "False", "False"]


# --- the accelerator branches, run on this CPU ------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_step_built_for_a_tpu_runs_here_as_the_cpu_s(dtype):
    """The fused form (XLA's kernel) and the dense layer's accelerator backward, run on this CPU, train
    as the CPU's forms do: losses and gradient norms to float rounding, two steps on."""
    from helpers import MC, TC as SMOKE, new_engine, task
    config = dataclasses.replace(MC, dtype=dtype)           # the suite's smoke engine: programs shared
    runs = {}
    for platform in ("cpu", "tpu"):
        engine = new_engine(config, SMOKE, backend=platform)
        state, metrics = engine.init([0]), []
        for step in range(2):
            state, m = engine.step(state, engine.shard([task().sample(0, step)]))
            metrics.append([float(m["loss"]), float(m["grad_norm"])])
        runs[platform] = np.array(metrics)
    tolerance = 1e-5 if dtype == "float32" else 2e-2      # bfloat16: rounded in other places, each 2^-8
    np.testing.assert_allclose(runs["tpu"], runs["cpu"], rtol=tolerance)
    assert not np.array_equal(runs["tpu"][0], runs["tpu"][1])    # it trained: the second step differs


@pytest.mark.parametrize("weights", ["float32", "bfloat16", "int8"])
def test_decoding_built_for_a_gpu_runs_here_to_the_cpu_s_tokens(weights):
    """The off-CPU products (float32's dot, bfloat16's hi + lo, int8's two parts), run on this CPU, draw
    the greedy tokens the CPU's one-row loop does, for four rows of unequal length (each as it would
    alone: tests/test_decoding_generate_cached.py)."""
    model = LanguageModel(SMALL, rngs=nnx.Rngs(1))
    rows = [np.array([3, 1, 4, 1, 5]), np.array([9, 2, 6]), np.array([5, 3, 5, 8]), np.array([9])]
    got = Decoder(model, weights=weights, backend="tpu")(rows, 4, temperature=0)
    want = Decoder(model, weights=weights, backend="cpu")(rows, 4, temperature=0)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_the_cpu_s_one_row_loop_and_the_accelerators_product_agree_in_logits():
    rng = np.random.default_rng(0)
    x, w = jnp.asarray(rng.standard_normal((1, 64)), jnp.float32), jnp.asarray(rng.standard_normal((48, 64)))
    # bfloat16 weights: the CPU's sums are float32's, the accelerators' take x in two parts (16 bits)
    for weight, tolerance in ((w, 1e-5), (w.astype(jnp.bfloat16), 1e-4)):
        cpu = jax.jit(functools.partial(layout.product, backend="cpu"))(x, weight)
        gpu = jax.jit(functools.partial(layout.product, backend="cuda"))(x, weight)
        np.testing.assert_allclose(np.asarray(gpu), np.asarray(cpu), rtol=tolerance, atol=tolerance)
    levels, scale = layout.quantized(w)
    cpu = jax.jit(functools.partial(layout.product, backend="cpu"))(x, levels, scale)
    gpu = jax.jit(functools.partial(layout.product, backend="cuda"))(x, levels, scale)
    np.testing.assert_allclose(np.asarray(gpu), np.asarray(cpu), rtol=1e-2, atol=2e-2)   # x in 15 bits
