"""The plain average, three ways, and why it cannot see order.

`python -m experiments.averaging` checks the chapter's two opening facts on random
vectors: shuffling a window leaves its average unchanged (only summation order moves,
book max |diff| 2.98e-08), and the prefix averages computed by a Python loop, by a
lower-triangular matrix with rows summing to one, and by a softmax over an all-zero
score matrix under the causal mask are the same numbers (book 5.96e-08). It also
prints the 6×6 averaging matrix: the causal mask and the softmax, already on screen.
"""
from __future__ import annotations

import numpy as np

from experiments.harness import report
from experiments.harness.experiment import Experiment, Result

NAME = "averaging"
# Every preset is cheap; smoke only shrinks the window so tests take milliseconds.
PRESETS = {
    "smoke": dict(tokens=32, width=32, seed=0),
    "cpu": dict(tokens=128, width=128, seed=0),
    "paper": dict(tokens=128, width=128, seed=0),
}
ROUNDING = 1e-6   # float32 has 24 bits of mantissa: differences of order 1e-7 are reordering noise


def prefix_means_by_loop(x):
    """The obvious version: average x[:t+1] for every t, one position at a time.

    In NumPy float32 on purpose: each of the T slice shapes is a new program for XLA,
    so in JAX this reference loop would spend seconds compiling, eager or under `jit`.
    """
    x = np.asarray(x, np.float32)
    return np.stack([x[: t + 1].mean(0) for t in range(x.shape[0])])


def prefix_means_by_matmul(x):
    """The same thing as one product with a lower-triangular matrix whose rows sum to 1."""
    import jax.numpy as jnp
    A = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), x.dtype))
    return (A / A.sum(1, keepdims=True)) @ x


def prefix_means_by_softmax(x):
    """And again: softmax of equal scores, with the future set to -inf by the causal mask."""
    import jax.numpy as jnp
    from attention_jax import functional as F
    T = x.shape[0]
    return F.masked_softmax(jnp.zeros((T, T), x.dtype), F.causal_mask(T)) @ x


def draw(key, *, tokens, width):
    """A window of random token vectors and the same window in a random order."""
    import jax
    import jax.numpy as jnp
    key_x, key_perm = jax.random.split(key)
    x = jax.random.normal(key_x, (tokens, width), jnp.float32)
    return x, x[jax.random.permutation(key_perm, tokens)]


def compare(x, shuffled, loop):
    """Every difference, compiled as one function (eagerly, each small op would compile on its own)."""
    import jax.numpy as jnp
    from attention_jax import functional as F
    tokens = x.shape[0]
    A = F.uniform_causal_weights(tokens)
    diff = lambda a, b: jnp.max(jnp.abs(a - b))
    return dict(shuffle=diff(A[-1] @ x, A[-1] @ shuffled), matmul=diff(loop, prefix_means_by_matmul(x)),
                softmax=diff(loop, prefix_means_by_softmax(x)), library=diff(loop, A @ x),
                row_sum=jnp.max(jnp.abs(A.sum(1) - 1)), upper=jnp.max(jnp.abs(jnp.triu(A, k=1))),
                small=F.uniform_causal_weights(6))


def matrix_figure(A):
    """The averaging matrix as a picture: row t spreads 1/(t+1) over tokens 0..t, nothing after t."""
    import numpy as np
    A = np.asarray(A)
    fig, ax = report.figure(size=(4.8, 4.2))
    image = ax.imshow(A, cmap="Blues", vmin=0, vmax=1)
    for (i, j), v in np.ndenumerate(A):
        ax.text(j, i, f"{v:.2f}" if v else "0", ha="center", va="center", fontsize=8,
                color="white" if v > 0.6 else "black")
    ax.set(xlabel="token averaged over (key)", ylabel="position (query)", xticks=range(len(A)), yticks=range(len(A)),
           title=f"the {len(A)}×{len(A)} prefix-averaging matrix")
    fig.colorbar(image, ax=ax, shrink=0.8, label="weight")
    return fig


def run(ctx) -> Result:
    import functools

    import jax
    p = ctx.settings
    T, d = p["tokens"], p["width"]
    # Full float32 matmuls: TPUs default to bfloat16 passes, which would swamp the 1e-7 effect.
    with jax.default_matmul_precision("highest"):
        x, shuffled = jax.jit(functools.partial(draw, tokens=T, width=d))(jax.random.key(p["seed"]))
        m = jax.device_get(jax.jit(compare)(x, shuffled, prefix_means_by_loop(x)))
    rows = [dict(comparison="window average vs the same window shuffled", diff=m["shuffle"], book=2.98e-08),
            dict(comparison="loop vs lower-triangular matmul", diff=m["matmul"], book=5.96e-08),
            dict(comparison="loop vs softmax over masked zeros", diff=m["softmax"], book=5.96e-08),
            dict(comparison="loop vs F.uniform_causal_weights @ x", diff=m["library"], book=None)]
    rows = [{**r, "diff": float(r["diff"])} for r in rows]
    small = m["small"]
    matrix_rows = [{f"c{j}": float(small[i, j]) for j in range(6)} for i in range(6)]

    table = report.format_table([("comparison", "comparison", "s"), ("diff", "max |diff| (ours)", ".3g"),
                                 ("book", "book", ".3g")], rows)
    matrix = report.format_table([(f"c{j}", f"{j}", ".3f") for j in range(6)], matrix_rows)
    print(f"T = {T} tokens of width {d}, float32, seed {p['seed']}")
    print("the averaging matrix A (rows sum to 1, upper triangle is zero):")
    for i in range(6):
        print("  " + " ".join(f"{float(v):.3f}" for v in small[i]))

    claims = [report.claim(f"{r['comparison']}: equal up to float32 rounding (< {ROUNDING:g})",
                           r["diff"] < ROUNDING, f"max |diff| = {r['diff']:.3g}") for r in rows]
    claims.append(report.claim(
        "the averaging matrix has rows summing to 1 and a zero upper triangle",
        m["row_sum"] < ROUNDING and m["upper"] == 0,
        f"max |row sum - 1| = {m['row_sum']:.3g}, max |upper| = {m['upper']:.3g} (T = {T})"))
    book = [report.book(f"max |diff|: {r['comparison']}", r["book"], r["diff"], ".3g") for r in rows if r["book"]]
    return Result(rows=rows, claims=claims, config=p, book=book,
                  tables={"Same average, four ways": table, "The 6×6 averaging matrix": matrix},
                  figures={"averaging_matrix.png": matrix_figure(small)},
                  extra={"averaging_matrix_6x6": small})


EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run, smoke_decides=True)   # exact claims: decided at any budget
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
