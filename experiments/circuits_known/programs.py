"""The compiled programs whose circuits are known: tracr's library, compiled here, with their inputs.

Each program compiles (tracr, the test extra's oracle) into our modules (`attention_jax.compiled`),
and its true edges are read off the compiler's blocks (`compiled.true_edges`). The clean inputs are
every input of one length (or a seeded sample of them), the corrupted ones the same inputs in
another order, none left in its own place (the ACDC paper's way for tracr: Conmy et al. 2023).
"""
from __future__ import annotations

import itertools

import numpy as np

PROGRAMS = {    # name -> (tracr.compiler.lib's maker and its arguments, vocabulary, max_seq_len, input length)
    "reverse": ("make_reverse", ("tokens",), (1, 2, 3), 5, 4),
    "frac_prevs": ("make_frac_prevs", ("tokens == x",), ("w", "x", "y", "z"), 5, 4),
    "hist": ("make_hist", (), ("a", "b", "c"), 5, 4),
    "sort_unique": ("make_sort_unique", ("tokens", "tokens"), (1, 2, 3, 4, 5), 5, 4),
}
SEED = 0


def program(name: str):
    """The RASP program of `name`, from tracr's library."""
    from tracr.compiler import lib
    from tracr.rasp import rasp
    maker, args, *_ = PROGRAMS[name]
    made = {"tokens": rasp.tokens, "tokens == x": rasp.numerical(rasp.Map(lambda t: t == "x", rasp.tokens))}
    return getattr(lib, maker)(*[made[a] for a in args])


def inputs(name: str, most: int) -> tuple[list, list]:
    """(clean, corrupted): up to `most` distinct inputs of the program's length (sort_unique's without a
    repeated value), and the same inputs reordered so that none keeps its own place."""
    _, _, vocab, _, length = PROGRAMS[name]
    every = (itertools.permutations(vocab, length) if name == "sort_unique" else
             itertools.product(vocab, repeat=length))
    every = [list(x) for x in every]
    draw = np.random.default_rng(SEED)
    clean = [every[i] for i in sorted(draw.choice(len(every), min(most, len(every)), replace=False))]
    order = draw.permutation(len(clean))
    while np.any(order == np.arange(len(clean))):       # a derangement: every corrupted input another's
        order = draw.permutation(len(clean))
    return clean, [clean[i] for i in order]


def built(name: str, most: int) -> dict:
    """The compiled program in our modules: model, token ids of the clean and corrupted inputs, the true
    edges, and whether the model answers as RASP evaluates it on every input."""
    from attention_jax import compiled
    from tracr.rasp import rasp
    _, _, vocab, max_len, _ = PROGRAMS[name]
    made = compiled.compile_rasp(program(name), set(vocab), max_len)
    model, encode, decode = compiled.from_tracr(made)
    clean, corrupted = inputs(name, most)
    ids = [np.asarray(encode(rows)) for rows in (clean, corrupted)]
    answers = [row[1:] for tokens in ids for row in decode(model(tokens))]
    wanted = [rasp.evaluate(program(name), x) for x in clean + corrupted]
    same = all(np.allclose(np.asarray(a, float), np.asarray(w, float), atol=1e-3) if name == "frac_prevs"
               else list(a) == list(w) for a, w in zip(answers, wanted))
    return {"model": model, "clean": ids[0], "corrupted": ids[1], "true": compiled.true_edges(made),
            "answers": same, "inputs": len(clean)}
