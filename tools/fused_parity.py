"""Which kernel the `fused` attention backend runs here, and whether it agrees with the reference.

    python tools/fused_parity.py

For float32, bfloat16 and float16 operands, with and without an ALiBi bias: the kernel
`speed.forms.fused_kernel` chooses on this backend, whether the compiled program really calls cuDNN
(its `__cudnn$fmha` custom call in the HLO: exit 1 when the kernel chosen is not the one
that runs), and the largest difference from the reference
attention computed in float32 (`F.attention` under the causal mask), forward and in the
gradients of q, k and v, every float32 product in full float32 (not a GPU's default TF32).
Exit 1 when a difference is past its dtype's tolerance. The tests
check the same parity on a CPU; this is for a machine with a GPU, where the cuDNN path runs
(`tools/device_check.sh` calls it).
"""
import sys

import jax
import jax.numpy as jnp

from attention_jax.speed import forms as backends
from attention_jax import functional as F

TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}   # of |diff| / max |reference|


def reference(q, k, v, bias):
    mask = F.causal_mask(q.shape[-2])
    return F.attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), mask=mask, bias=bias)


def check(dtype: str, with_bias: bool, B=4, H=4, T=128, D=32) -> bool:
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, g = (jax.random.normal(key, (B, H, T, D), jnp.float32) for key in keys)
    bias = F.alibi_bias(H, T) if with_bias else None
    cast = lambda *xs: [x.astype(dtype) for x in xs]

    def loss(fn):   # a fixed projection of the output, so every input gets a gradient
        return lambda q, k, v: (fn(q, k, v).astype(jnp.float32) * g).sum()

    fused = lambda q, k, v: backends.fused(q, k, v, bias=bias)
    ref = lambda q, k, v: reference(q, k, v, bias)
    grad_fused = jax.jit(jax.value_and_grad(loss(fused), argnums=(0, 1, 2)))
    args = cast(q, k, v)
    hlo = grad_fused.lower(*args).compile().as_text()
    (_, got), (_, want) = grad_fused(*args), jax.value_and_grad(loss(ref), argnums=(0, 1, 2))(*args)
    out_diff = float(jnp.abs(jax.jit(fused)(*args).astype(jnp.float32) - ref(*args)).max())
    out_diff /= float(jnp.abs(ref(*args)).max())
    grad_diff = max(float(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)).max() / jnp.abs(b.astype(jnp.float32)).max())
                    for a, b in zip(got, want))
    kernel, called = backends.fused_kernel(dtype, D), "__cudnn$fmha" in hlo    # cuDNN's attention custom calls
    ok = out_diff <= TOLERANCE[dtype] and grad_diff <= TOLERANCE[dtype] and called == (kernel == "cudnn")
    print(f"{dtype:9} bias={'alibi' if with_bias else 'none ':5}  kernel {kernel:5}  "
          f"cuDNN attention in the program: {'yes' if called else 'no ':3}  "
          f"max |diff| / max |ref|: output {out_diff:.2e}, gradients {grad_diff:.2e}  "
          f"{'ok' if ok else 'PAST ' + str(TOLERANCE[dtype])}", flush=True)
    return ok


def main() -> int:
    print(f"backend {jax.default_backend()}, devices {jax.devices()}, jax {jax.__version__}")
    # Every float32 product in full float32: a GPU's default takes them in TF32 (10 mantissa bits),
    # which would measure TF32's rounding in two programs rather than the kernels' agreement.
    with jax.default_matmul_precision("highest"):
        results = [check(dtype, with_bias) for dtype in ("float32", "bfloat16", "float16") for with_bias in (False, True)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
