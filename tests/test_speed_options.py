"""attention_jax.speed.options: a Speed is checked when made, says which form computes a config's
attention on each backend (refusing the ones it cannot take), names it as a run reports it, and
is made without importing JAX."""

import dataclasses
import subprocess
import sys

import pytest

from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError
from attention_jax.speed import Speed
from attention_jax.speed.backend import Backend

TINY = ModelConfig(vocab_size=50, context=8, d_model=32, n_layers=2, n_heads=4)


@pytest.mark.parametrize("change, needle", [
    ({"form": "flash"}, "Speed(form='flash'); choose one of auto, reference, causal_halves, chunked, fused"),
    ({"chunk": 0}, "Speed(chunk=0) must be a positive whole number"),
    ({"chunk": True}, "Speed(chunk=True)"),
    ({"dense": "yes"}, "Speed(dense='yes') must be True or False"),
    ({"matmul_dtype": "float16"}, "Speed(matmul_dtype='float16'); choose None or 'bfloat16'"),
    ({"matmul_dtype": "bfloat16", "dense": False}, "it needs dense=True"),
])
def test_a_speed_that_cannot_be_is_refused_in_one_line(change, needle):
    with pytest.raises(ConfigError) as info:
        Speed(**change)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_auto_is_causal_halves_on_a_cpu_and_fused_on_an_accelerator_unless_dropout():
    auto = Speed()
    assert auto.form_for(TINY, "cpu") == "causal_halves"
    assert auto.form_for(TINY, "gpu") == auto.form_for(TINY, "tpu") == "fused"
    assert auto.form_for(dataclasses.replace(TINY, dropout=0.1), "gpu") == "causal_halves"   # fused has no dropout
    assert Speed(form="chunked").form_for(TINY, "gpu") == "chunked"


def test_the_forms_a_config_cannot_take_are_refused_naming_both():
    with pytest.raises(ConfigError, match="cannot compute positions='alibi'"):
        Speed(form="chunked").form_for(dataclasses.replace(TINY, positions="alibi"))
    with pytest.raises(ConfigError, match="form='fused' has no dropout on its weights"):
        Speed(form="fused").form_for(dataclasses.replace(TINY, dropout=0.1))
    assert Speed(form="causal_halves").form_for(dataclasses.replace(TINY, dropout=0.1)) == "causal_halves"


def test_the_form_is_named_as_a_run_reports_it(cudnn):
    assert Speed().describe(TINY, "cpu") == "causal_halves"
    assert Speed().describe(TINY, "tpu") == "fused (XLA)"
    assert Speed().describe(TINY, "gpu") == \
        "fused (XLA's kernel; cuDNN's flash attention takes bfloat16/float16; this model computes in float32)"
    bf16 = dataclasses.replace(TINY, dtype="bfloat16")
    assert Speed().describe(bf16, "gpu") == "fused (cuDNN)" and Speed().describe(bf16, "tpu") == "fused (XLA)"
    assert Speed().describe(bf16, Backend("cuda", 7.5)) == \
        "fused (XLA's kernel; cuDNN's flash attention needs compute capability 8.0; this GPU has 7.5)"
    odd = dataclasses.replace(bf16, context=7, positions="alibi")    # cuDNN's gradient takes no bias over odd T
    assert Speed().describe(odd, "gpu") == \
        "fused (XLA's kernel; cuDNN refused: NotImplementedError: Unsupported sequence length Q 7, KV 7.)"
    assert Speed(form="chunked", chunk=16).describe(TINY, "gpu") == "chunked (16 positions a chunk)"
    assert Speed(form="reference").describe(TINY) == "reference"


def test_a_speed_is_made_without_importing_jax():
    code = "import sys; from attention_jax.speed import Speed; Speed(form='chunked'); print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_decoding_with_the_cache_is_said_to_run_the_reference_and_does():
    """What `describe(decoding=True)` says is what the cached prefill compiles: no form's scope, where
    the model's own forward, swapped alike, runs causal_halves."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from attention_jax.decoding import loops
    from attention_jax.decoding.generate import Decoder
    from attention_jax.model import LanguageModel
    assert Speed().describe(TINY, "cpu") == "causal_halves"
    assert Speed().describe(TINY, "cpu", decoding=True).startswith("reference (a query reads the slots")
    decoder = Decoder(LanguageModel(TINY, rngs=nnx.Rngs(0)), backend="cpu")
    prompt, padding = jnp.zeros((1, 3), jnp.int32), jnp.zeros((1,), jnp.int32)
    graph, empty, rest = loops.cached_model(decoder.graphdef, decoder.state, 1, 5)
    cached = loops.prefill.lower(graph, rest, empty, prompt, padding).as_text(debug_info=True)
    model = nnx.merge(decoder.graphdef, decoder.state)
    forward = jax.jit(lambda tokens: model(tokens)).lower(prompt).as_text(debug_info=True)
    forms = lambda text: {f for f in ("causal_halves", "chunked", "fused") if f"attention_{f}" in text}
    assert forms(forward) == {"causal_halves"} and forms(cached) == set()


@pytest.mark.parametrize("backend, dtype", [
    (Backend("cuda", 7.5), "float16"),      # a T4: float16 tensor cores only
    (Backend("cuda", 7.0), "float16"),      # a V100
    (Backend("cuda", 8.0), "bfloat16"),     # an A100
    (Backend("cuda", 8.9), "bfloat16"),     # an L4
    (Backend("cuda", 9.0), "bfloat16"),     # an H100
    (Backend("cuda"), "bfloat16"),          # capability not known: a current one
    ("tpu", "bfloat16"),
    ("cpu", "float32"),
    ("rocm", "float32"),
])
def test_each_backend_is_told_the_dtype_it_trains_fastest_in(backend, dtype):
    from attention_jax.speed import dtype_for
    chosen, why = dtype_for(backend)
    assert chosen == dtype and ModelConfig(dtype=chosen).dtype == chosen and why and "\n" not in why
    assert ("loss scale" in why) == (dtype != "float32")
