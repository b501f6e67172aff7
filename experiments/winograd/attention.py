"""Attention at the referent (heads averaged), and the claims on every figure."""
from __future__ import annotations

import numpy as np

from experiments.harness import report
from experiments.winograd.constants import CHANCE, IDENTICAL, ROWS


def demo_words(spec) -> tuple[str, str, str, str]:
    """(x, y, crosser adjective, crossed adjective) of the demo pair: the book's where the lists have them."""
    animals, places = spec.kind("animal"), spec.kind("place")
    x, y = (animals[0], places[0]) if animals and places else spec.nouns[:2]
    if "animal" in spec.nouns and "street" in spec.nouns:
        x, y = "animal", "street"
    sides = dict(spec.adjectives)
    first = lambda side, book: book if sides.get(book) == side else next(a for a, s in spec.adjectives if s == side)
    return x, y, first("x", "tired"), first("y", "wet")


def referent_attention(model, tokens: np.ndarray, position: int) -> np.ndarray:
    """[L, N, position + 1]: each block's attention at `position`, heads averaged, float64."""
    import jax.numpy as jnp
    from attention_jax.analysis.inspect import run_with_cache
    _, cache = run_with_cache(model, jnp.asarray(tokens), "blocks.*.mixer.attention.weights")
    blocks = sorted(cache, key=lambda n: int(n.split(".")[1]))
    return np.stack([np.asarray(cache[n], np.float64).mean(axis=1)[:, position, :position + 1] for n in blocks])


def save_viewer(model, task, path, title: str):
    """The interactive viewer (attention_jax.analysis.viewer) on the demo sentence: every block and head."""
    from attention_jax.analysis import viewer
    from attention_jax.data import winograd as wg
    x, y, adj_x, _ = demo_words(task.spec)
    sentence = wg.render(task.spec, x, y, adj_x)
    ids = wg.encode([sentence], task.vocab)[0, :-1]
    viewer.view(model, ids, sentence.split(" ")[:-1], title=title).save(path)


def attention_demo(model, task) -> dict:
    """The tired/wet pair, block 2 over every adjective, and block 1's identity across adjectives."""
    from attention_jax.data import winograd as wg
    spec, pos = task.spec, task.heldout.position
    x, y, adj_x, adj_y = demo_words(spec)
    adjectives = [a for a, _ in spec.adjectives]
    sentences = [wg.render(spec, x, y, a) for a in adjectives]
    ids = wg.encode(sentences, task.vocab)[:, :-1]
    from attention_jax.speed import fast
    w = referent_attention(model, ids, pos)                       # [L, A, pos + 1]
    with fast(model):                                             # as the engine computes it
        logits = np.asarray(model(ids))[:, pos]
    ix, iy = adjectives.index(adj_x), adjectives.index(adj_y)
    # Every held-out sentence: block 1's row against the same pair's other adjectives, block 2's mean rule.
    held = task.heldout
    hw = referent_attention(model, held.x, pos)
    groups = {}
    for n, (a, b) in enumerate(zip(held.x_noun.tolist(), held.y_noun.tolist())):
        groups.setdefault((a, b), []).append(n)
    spread = max(float(np.abs(hw[0, g] - hw[0, g[0]]).max()) for g in groups.values())
    words = spec.template.split(" ")
    slot = {s: words.index("{" + s + "}") for s in ("x", "y", "adj")}
    rule = {}
    for a in adjectives:
        m = hw[-1, held.adj == a].mean(axis=0)
        rule[a] = {"x": float(m[slot["x"]]), "y": float(m[slot["y"]]), "adj": float(m[slot["adj"]]),
                   "rest": float(1.0 - m[slot["x"]] - m[slot["y"]] - m[slot["adj"]])}
    return {"pair": [x, y], "adjectives": adjectives, "demo": [adj_x, adj_y], "position": pos, "slots": slot,
            "words": [s.split(" ")[:pos + 1] for s in sentences],
            "weights": w.tolist(),                                 # [L][A][pos + 1]
            "predicted": [task.vocab[i] for i in logits.argmax(-1)],
            "block1_pair_diff": float(np.abs(w[0, ix] - w[0, iy]).max()),
            "block1_all_adjectives_diff": float(np.abs(w[0] - w[0, :1]).max()),
            "block1_heldout_diff": spread,
            "block1_adjective_weight": float(w[0, :, slot["adj"]].max()),
            "block2_shift": float(0.5 * np.abs(w[-1, ix] - w[-1, iy]).sum()),
            # The last block's weight on the noun the adjective picks, less its weight on the other
            # noun, at the adjective that does it least (held-out means).
            "block2_pick_margin": min(rule[a][side] - rule[a]["y" if side == "x" else "x"]
                                      for a, side in spec.adjectives),
            "block2_rule": rule, "pair_heldout": (x, y) in set(task.heldout_pairs)}


# --- claims ---------------------------------------------------------------------------------

def claims(r: dict) -> list[dict]:
    acc = {k: 100 * v["accuracy"] for k, v in r.items() if k in ROWS}
    out = []
    if "clean_average" in acc:
        a = acc["clean_average"]
        other = 100 * r["clean_average"]["other_noun"]
        out.append(report.claim(f"the uniform average does no better than chance ({CHANCE:g}%) on the clean task",
                                a <= CHANCE, f"{a:.1f}%, other noun {other:.1f}% (book 27.9%, other noun 50%)",
                                CHANCE - a))
    if {"clean_one_block", "clean_two_blocks"} <= set(acc):
        one, two = acc["clean_one_block"], acc["clean_two_blocks"]
        out.append(report.claim("two blocks >= one block >= 85% on the clean task", two >= one >= 85.0,
                                f"{two:.1f}% >= {one:.1f}% >= 85% (book 100% >= 92.7%)", min(two - one, one - 85.0)))
    if "attention" in r:
        att = r["attention"]
        d, (a, b) = att["block1_pair_diff"], att["demo"]
        out.append(report.claim(f"block 1's rows at the referent are the same for '{a}' and '{b}' "
                                f"(max difference < {IDENTICAL:g})", d < IDENTICAL,
                                f"max difference {d:.3g}; block 1 puts up to {att['block1_adjective_weight']:.3f} "
                                f"on the adjective", IDENTICAL - d))
    if "attention" in r and "block2_pick_margin" in r["attention"]:
        m = r["attention"]["block2_pick_margin"]
        out.append(report.claim("the last block looks more at the noun the adjective picks than at the other, "
                                "for every adjective (held-out means)", m > 0,
                                f"smallest margin {m:.3f} of attention weight", m))
    if {"leaky_average", "leaky_one_block"} <= set(acc):
        u, one = acc["leaky_average"], acc["leaky_one_block"]
        out.append(report.claim("in the leaky task the uniform average matches or beats one block", u >= one,
                                f"{u:.1f}% vs {one:.1f}% (book 100% vs 91.7%)", u - one))
    if "causal" in r:            # the story, causally (experiments.winograd.causal)
        from experiments.winograd.causal import claims as causal_claims
        out += causal_claims(r["causal"])
    return out
