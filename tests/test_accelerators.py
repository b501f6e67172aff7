"""What runs on a GPU or a TPU, proven on this CPU: every compiled program of the library lowers for
cuda and for tpu (`jax.export`), holding cuDNN's attention exactly where `Speed.describe` says so and
no CPU-only branch; and the accelerator branches, run here, equal the CPU's.

A CPU cannot check that XLA's GPU compiler, cuDNN and libtpu accept these programs, their numbers
there, or their speed (docs/install.md says so); the device check (tools/device_check.sh) does,
when a GPU is lent.
"""

import dataclasses
import functools
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import export

from attention_jax.analysis import patching
from attention_jax.decoding import loops as decode
from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.decoding.generate import Decoder
from attention_jax.model import LanguageModel
from attention_jax.speed import Speed
from attention_jax.speed.backend import Backend
from attention_jax.train import Engine
from experiments.configs import LADDER

CUDNN = ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward")
# Named scopes the library puts around what only a CPU should run: the cuda and tpu programs hold none.
CPU_ONLY = ("cpu_only", "attention_causal_halves")
PLATFORMS = ("cuda", "tpu")
TC = TrainConfig(batch_size=4)


def lowered(fn, platform: str, *args, **kwargs) -> str:
    """`fn` (a jit-compiled function) exported for `platform`: its StableHLO text, locations included."""
    exported = export.export(fn, platforms=(platform,),
                             disabled_checks=[export.DisabledSafetyCheck.custom_call(c) for c in CUDNN])
    return exported(*args, **kwargs).mlir_module()


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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("row", LADDER, ids=lambda r: r.name)
def test_every_ladder_row_trains_on_cuda_and_tpu_with_cudnn_where_described(row, dtype, cudnn):
    config = dataclasses.replace(row.config, dtype=dtype)
    for platform in PLATFORMS:
        said = Speed().describe(config, platform)
        for n_seeds in (1, 2):
            engine = Engine(config, TC, n_seeds=n_seeds, backend=platform)
            text = lowered(engine._step, platform, *step_args(engine, n_seeds))
            check(text, platform, cudnn=said == "fused (cuDNN)", fused=config.heads_used > 0)
    # On cuda, cuDNN for every bfloat16 row with heads (head dims 32 and 128), never for float32.
    assert (Speed().describe(config, "cuda") == "fused (cuDNN)") == (dtype == "bfloat16" and config.heads_used > 0)


def test_the_checks_would_see_a_cpu_program():
    """The CPU's program of a bfloat16 block holds both CPU-only names, so their absence above means something."""
    config = dataclasses.replace(LADDER[-1].config, dtype="bfloat16")
    engine = Engine(config, TC, backend="cpu")
    text = lowered(engine._step, "cpu", *step_args(engine))
    assert all(name in text for name in CPU_ONLY) and "attention_fused" not in text


@pytest.mark.parametrize("capability, dtype", [(7.5, "bfloat16"), (9.0, "float32")])
def test_a_t4_or_float32_gets_xla_s_kernel_and_says_why(capability, dtype, cudnn):
    config = dataclasses.replace(LADDER[-1].config, dtype=dtype)
    gpu = Backend("cuda", capability)
    engine = Engine(config, TC, backend=gpu)
    check(lowered(engine._step, "cuda", *step_args(engine)), "cuda", cudnn=False, fused=True)
    assert Speed().describe(config, gpu).startswith("fused (XLA's kernel; cuDNN's flash attention ")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_multi_step_scan_and_evaluation_lower(platform, cudnn):
    config = dataclasses.replace(LADDER[-1].config, dtype="bfloat16")
    engine = Engine(config, TC, backend=platform)
    state, batch = step_args(engine)
    steps = {k: jax.ShapeDtypeStruct((16, *v.shape), v.dtype) for k, v in batch.items()}
    check(lowered(engine._steps, platform, state, steps), platform, cudnn=platform == "cuda", fused=True)
    windows = jax.ShapeDtypeStruct((8, config.context), jnp.int32)
    # Evaluation has no backward: cuDNN's forward alone.
    nll = lowered(engine._nll, platform, state, windows, windows, None)
    assert ("__cudnn$fmhaSoftmax" in custom_calls(nll)) == (platform == "cuda")
    assert not [n for n in CPU_ONLY if n in nll]
    assert not [n for n in CPU_ONLY if n in lowered(engine._logits, platform, state, windows)]


SMALL = ModelConfig(vocab_size=64, context=16, d_model=32, n_layers=2, n_heads=4)


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


def _logit_diff(logits):
    return patching.logit_diff(logits, 1, 2)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_patching_sweep_and_attribution_gradients_lower(platform):
    model = LanguageModel(SMALL, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    tokens = jnp.zeros((2, 16), jnp.int32)
    names = tuple(f"blocks.{i}.mixer.z" for i in range(SMALL.n_layers))
    indices = jnp.zeros((4, 2), jnp.int32)
    zeros = {n: jax.ShapeDtypeStruct((2, SMALL.n_heads, 16, SMALL.d_head_used), jnp.float32) for n in names}
    assert "stablehlo" in lowered(patching._recorded, platform, graphdef, state, tokens, names=names)
    text = lowered(patching._sweep, platform, graphdef, state, tokens, zeros, indices, names=names,
                   axes=patching.HOOKS["z"][1], by="head", metric=_logit_diff)
    assert not [n for n in CPU_ONLY if n in text]
    assert "stablehlo" in lowered(patching._gradients, platform, graphdef, state, tokens, zeros, names=names,
                                  metric=_logit_diff)


MESH_SCRIPT = """
import dataclasses, jax, jax.numpy as jnp
from jax import export
from attention_jax.train import Engine, TrainConfig
from experiments.configs import LADDER
assert jax.device_count() == 8, jax.devices()
config = dataclasses.replace(LADDER[-1].config, dtype="bfloat16")
engine = Engine(config, TrainConfig(batch_size=16), backend="tpu")
state = engine.abstract_state([0])
x = jax.ShapeDtypeStruct((16, config.context), jnp.int32, sharding=engine.mesh and
                         jax.sharding.NamedSharding(engine.mesh, jax.sharding.PartitionSpec("data")))
exported = export.export(engine._step, platforms=("tpu",))(state, {"x": x, "y": x})
text = exported.mlir_module()
print(exported.nr_devices, "attention_fused" in text, "cpu_only" in text, "attention_causal_halves" in text)
"""


def test_a_step_over_an_8_device_mesh_lowers_for_tpu():
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
    out = subprocess.run([sys.executable, "-c", MESH_SCRIPT], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["8", "True", "False", "False"]


# --- the accelerator branches, run on this CPU ------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_step_built_for_a_tpu_runs_here_as_the_cpu_s(dtype):
    """The fused form (XLA's kernel) and the dense layer's accelerator backward, run on this CPU, train
    as the CPU's forms do: losses and gradient norms to float rounding, three steps on."""
    from helpers import task
    config = dataclasses.replace(ModelConfig(vocab_size=64, context=16, d_model=32, n_heads=2), dtype=dtype)
    runs = {}
    for platform in ("cpu", "tpu"):
        engine = Engine(config, TrainConfig(batch_size=8, lr=1e-2), backend=platform)
        state, metrics = engine.init([0]), []
        for step in range(3):
            state, m = engine.step(state, engine.shard([task().sample(0, step)]))
            metrics.append([float(m["loss"]), float(m["grad_norm"])])
        runs[platform] = np.array(metrics)
    tolerance = 1e-5 if dtype == "float32" else 2e-2      # bfloat16: rounded in other places, each 2^-8
    np.testing.assert_allclose(runs["tpu"], runs["cpu"], rtol=tolerance)


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["float32", "bfloat16", "int8"])
def test_decoding_built_for_a_gpu_runs_here_to_the_cpu_s_tokens(weights):
    """The off-CPU products (float32's dot, bfloat16's hi + lo, int8's two parts), run on this CPU, draw
    the greedy tokens the CPU's one-row loop does, for one row and for four of unequal length."""
    model = LanguageModel(SMALL, rngs=nnx.Rngs(1))
    prompts = [np.array([3, 1, 4, 1, 5]), np.array([9, 2, 6]), np.array([5, 3, 5, 8]), np.array([9])]
    for rows in (prompts[:1], prompts):
        got = Decoder(model, weights=weights, backend="tpu")(rows, 8, temperature=0)
        want = Decoder(model, weights=weights, backend="cpu")(rows, 8, temperature=0)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_the_cpu_s_one_row_loop_and_the_accelerators_product_agree_in_logits():
    from attention_jax.decoding import layout
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
