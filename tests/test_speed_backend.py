"""attention_jax.speed.backend: a backend from a name, devices or a mesh, checked when made; and the
programs built for one read nothing of this process's devices while they are traced."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.errors import ConfigError
from attention_jax.decoding.generate import Decoder
from attention_jax.model import LanguageModel
from attention_jax.speed import backend as backend_module
from attention_jax.speed.backend import Backend, backend_of
from attention_jax.train import Engine


class Device:
    """What JAX's devices show of themselves: a platform, a GPU's capability and its client's version."""

    def __init__(self, platform, capability=None, version="cuda 12080"):
        self.platform, self.client = platform, type("Client", (), {"platform_version": version})()
        if capability is not None:
            self.compute_capability = capability


def test_names_and_aliases():
    assert backend_of("gpu") == backend_of("CUDA") == Backend("cuda") == Backend("gpu")
    assert backend_of("tpu").platform == "tpu" and not backend_of("tpu").cpu and backend_of("cpu").cpu
    assert str(Backend("cuda", 7.5)) == "cuda (compute capability 7.5)" and str(Backend("tpu")) == "tpu"


@pytest.mark.parametrize("make, needle", [
    (lambda: Backend("metal"), "backend 'metal'; choose one of cpu, cuda, rocm, tpu"),
    (lambda: Backend("cuda", "8.0"), "capability='8.0' must be a GPU's compute capability"),
    (lambda: Backend("cuda", float("nan")), "capability=nan must be a GPU's compute capability"),
    (lambda: Backend("cuda", float("inf")), "capability=inf must be a GPU's compute capability"),
    (lambda: Backend("cuda", -8.0), "capability=-8.0 must be a GPU's compute capability"),
    (lambda: Backend("tpu", 8.0), "capability=8.0 is an NVIDIA GPU's; the tpu backend has none"),
    (lambda: backend_of(3), "backend=3: give a name"),
    (lambda: backend_of([]), "backend=[]: give a name"),
    (lambda: backend_of([Device("tpu"), Device("cpu")]), "the devices are of 2 kinds (cpu, tpu)"),
])
def test_a_backend_that_cannot_be_is_refused_in_one_line(make, needle):
    with pytest.raises(ConfigError) as info:
        make()
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("device, want", [
    (Device("gpu", "9.0"), Backend("cuda", 9.0)), (Device("gpu", "7.5"), Backend("cuda", 7.5)),
    (Device("gpu", "gfx90a", version="rocm 6.2"), Backend("rocm")),        # an AMD GPU: no cuDNN
    (Device("gpu"), Backend("cuda")), (Device("tpu"), Backend("tpu")), (Device("cpu"), Backend("cpu")),
])
def test_devices_say_their_backend_and_capability(device, want):
    assert backend_of(device) == backend_of([device, device]) == want


def test_the_default_is_this_process_s_devices_and_a_mesh_its_own():
    assert backend_of() == backend_of(jax.devices()) == Backend("cpu")
    mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
    assert backend_of(mesh) == Backend("cpu")


def test_programs_built_for_a_backend_read_no_device_while_traced(monkeypatch):
    """Engine and Decoder resolve their backend once, when made; tracing their programs afterwards
    asks JAX for no device (a backend read inside a trace is the global this module replaced)."""
    config = ModelConfig(vocab_size=32, context=8, d_model=16, n_layers=1, n_heads=2, dtype="bfloat16")
    engine = Engine(config, TrainConfig(batch_size=2), backend="tpu")
    decoder = Decoder(LanguageModel(config, rngs=nnx.Rngs(0)), backend="tpu", weights="bfloat16")
    from attention_jax.decoding import loops as decode
    # Made before: making the cache asks this process's devices how much memory they have free.
    graph, empty, rest = decode.cached_model(decoder.graphdef, decoder.state, 1, 4)

    def refuse():
        raise AssertionError("a program asked for this process's devices while it was traced")
    monkeypatch.setattr(backend_module, "default_devices", refuse)
    monkeypatch.setattr(jax, "default_backend", refuse)
    state, x = engine.abstract_state([0]), jax.ShapeDtypeStruct((2, 8), jnp.int32)
    engine._step.trace(state, {"x": x, "y": x})
    engine._nll.trace(state, x, x, None)
    decode.prefill.trace(graph, rest, empty, np.zeros((1, 3), np.int32), np.zeros(1, np.int32))
    cache, logits = jax.eval_shape(lambda: decode.prefill(graph, rest, empty, np.zeros((1, 3), np.int32),
                                                          np.zeros(1, np.int32)))
    decode.extend.trace(graph, rest, cache, logits, jax.random.key(0), jnp.float32(1),
                        jnp.zeros((1, 2), jnp.int32), 0, 1, greedy=True, top_k=None)
