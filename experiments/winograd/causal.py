"""The two-hop story, causally: activation patching between sentences that differ in one word.

The story read off the attention (the chapter's): block 1 moves the first noun forward to the
referent ("the" after "so"); block 2 reads the adjective there and either keeps that noun or
fetches the second one from its own place. Each part is tested by patching the residual stream
entering block 2 (`activation_patch(..., hook="resid_pre", by="position", into="corrupted")`, layer 1) from a
clean sentence into one with a single word changed, and reading how much of the clean answer
comes back (`normalized_logit_diff`: 1 the clean run's, 0 the corrupted's), on the held-out
noun pairs:
  * keep: an adjective picking the first noun, the first noun swapped for another; the story
    says the referent's own slot carries it into block 2 (block 1 put it there);
  * fetch: an adjective picking the second noun, the second noun swapped; block 2 takes it
    from the second noun's slot;
  * read: the adjective swapped for one picking the other noun; block 2 reads it at the
    adjective's slot, not at the referent (where block 1 would have had to copy it).
Each head of block 2 is patched too (`hook="z", by="head"`) on the adjective swap.
"""
from __future__ import annotations

import numpy as np

HALF = 0.5          # "carries it": patching that one slot brings back at least half of the clean answer
PAIRS = 16          # held-out noun pairs per sweep


def sentences(task, kind: str):
    """(clean, corrupted, answer ids, wrong ids) for one test, a sentence pair per held-out noun pair."""
    from attention_jax.data import winograd as wg
    spec, vocab = task.spec, task.vocab
    by_side = {s: [a for a, t in spec.adjectives if t == s] for s in ("x", "y")}
    pairs = list(dict.fromkeys(zip(task.heldout.x_noun.tolist(), task.heldout.y_noun.tolist())))[:PAIRS]
    clean, corrupted, answer, wrong = [], [], [], []
    for n, (x, y) in enumerate(pairs):
        other = next(w for w in spec.nouns[n % len(spec.nouns):] + spec.nouns if w not in (x, y))
        ax, ay = by_side["x"][n % len(by_side["x"])], by_side["y"][n % len(by_side["y"])]
        a, b, right, bad = {"keep": ((x, y, ax), (other, y, ax), x, other),
                            "fetch": ((x, y, ay), (x, other, ay), y, other),
                            "read": ((x, y, ax), (x, y, ay), x, y)}[kind]
        clean.append(wg.render(spec, *a))
        corrupted.append(wg.render(spec, *b))
        answer.append(vocab.index(right))
        wrong.append(vocab.index(bad))
    ids = lambda s: wg.encode(s, vocab)[:, :task.heldout.position + 1]     # up to the scored "the"
    return ids(clean), ids(corrupted), np.array(answer), np.array(wrong)


def causal_demo(model, task) -> dict:
    """Each test's restored share entering block 2 at every slot, block 2's heads on the adjective swap."""
    from attention_jax.analysis.patching import activation_patch, normalized_logit_diff
    pos, words = task.heldout.position, task.spec.template.split(" ")
    slot = {s: words.index("{" + s + "}") for s in ("x", "y", "adj")} | {"referent": pos}
    out = {"slots": slot, "words": words[:pos + 1], "pairs": PAIRS}
    from attention_jax.errors import NotMeasurable
    for kind in ("keep", "fetch", "read"):
        clean, corrupted, answer, wrong = sentences(task, kind)
        try:             # a model that barely tells the sentences apart: no share of its gap is a number
            metric = normalized_logit_diff(model, clean, corrupted, answer, wrong, position=pos)
        except NotMeasurable as e:
            nan = np.full(pos + 1, np.nan).tolist()
            out[kind] = {"restored": nan, "first_block": nan, "heads": [np.nan] * model.config.heads_used,
                         NOT_MEASURABLE: str(e)}
            continue
        sweep = activation_patch(model, clean, corrupted, metric, hook="resid_pre", by="position", into="corrupted").values
        out[kind] = {"restored": sweep[-1].tolist(), "first_block": sweep[0].tolist()}
        if kind == "read":
            out[kind]["heads"] = activation_patch(model, clean, corrupted, metric, hook="z",
                                                  by="head", into="corrupted").values[-1].tolist()
    at = lambda kind, where: out[kind]["restored"][slot[where]]
    out.update(keep_referent=at("keep", "referent"), keep_first=at("keep", "x"), fetch_second=at("fetch", "y"),
               fetch_referent=at("fetch", "referent"), read_adjective=at("read", "adj"),
               read_referent=at("read", "referent"), read_best_head=float(max(out["read"]["heads"])))
    return out


def claims(c: dict) -> list:
    from experiments.harness import report
    made = [
        report.claim(f"block 1 moves the first noun to the referent: entering block 2, that slot alone brings back "
                     f">= {HALF:g} of the first noun's answer", c["keep_referent"] >= HALF,
                     f"{c['keep_referent']:.2f}", c["keep_referent"] - HALF),
        report.claim(f"block 2 fetches the second noun from its own slot (>= {HALF:g} of its answer, more than "
                     "the referent's slot)", c["fetch_second"] >= max(HALF, c["fetch_referent"]),
                     f"{c['fetch_second']:.2f} vs referent {c['fetch_referent']:.2f}",
                     c["fetch_second"] - max(HALF, c["fetch_referent"])),
        report.claim(f"block 2 reads the adjective at its own slot (>= {HALF:g} of the answer, more than at the "
                     "referent)", c["read_adjective"] >= max(HALF, c["read_referent"]),
                     f"{c['read_adjective']:.2f} vs referent {c['read_referent']:.2f}; best head of block 2 "
                     f"{c['read_best_head']:.2f}", c["read_adjective"] - max(HALF, c["read_referent"])),
    ]
    figures = (("keep_referent",), ("fetch_second", "fetch_referent"), ("read_adjective", "read_referent"))
    return [report.claim(m["claim"], False, f"{NOT_MEASURABLE}: the answers' clean-corrupted logit difference is "
                                             "below its floor in a seed (no share of it is a number)")
            if any(np.isnan(c[k]) for k in keys) else m for m, keys in zip(made, figures)]


FAITHFUL = 0.8      # a circuit found: the fewest top edges (at most MOST_EDGES) recovering this share of the gap
MOST_EDGES = 30
ROLE = {"q": "query", "k": "key", "v": "value"}
KINDS = ("keep", "fetch", "read")
NOT_MEASURABLE = "not measurable"


def found(model, task, kind: str = "keep") -> dict:
    """What carries one test's answer, found rather than assumed: every edge of the model patched alone
    (`discovery.edge_patch`) from the corrupted sentences, the fewest top edges whose circuit alone recovers
    FAITHFUL of the answer, and that circuit in words: each head in it, which of its inputs the circuit
    feeds, and where it looks from the referent (mean attention over the sentences)."""
    import jax.numpy as jnp
    from attention_jax.analysis.discovery import edge_patch
    from attention_jax.analysis.faithfulness import smallest_circuit
    from attention_jax.analysis.edges import receiver_node
    from attention_jax.analysis.inspect import run_with_cache
    from attention_jax.analysis.patching import normalized_logit_diff
    from attention_jax.errors import NotMeasurable
    clean, corrupted, answer, wrong = sentences(task, kind)
    pos = task.heldout.position
    try:     # a model that barely tells the sentences apart has no gap to take a share of
        metric = normalized_logit_diff(model, clean, corrupted, answer, wrong, position=pos)
        exact = edge_patch(model, clean, corrupted, metric)
        found = smallest_circuit(model, clean, corrupted, metric, exact, share=FAITHFUL, most=MOST_EDGES)
    except NotMeasurable as e:
        return {"k": None, "faithfulness": float("nan"), "edges": [], "words": f"{NOT_MEASURABLE}: {e}",
                "kind": kind}
    _, cache = run_with_cache(model, jnp.asarray(clean), "blocks.*.mixer.attention.weights")
    slots = {"{x}": "the first noun", "{y}": "the second noun", "{adj}": "the adjective"}
    words = [f"{slots.get(w, repr(w))} ({i})" for i, w in enumerate(task.spec.template.split(" ")[:pos + 1])]
    looks = {}
    ends = [receiver_node(n)[0] for e in found.edges for n in e.split("->")]
    for name in dict.fromkeys(n for n in ends if ".h" in n):
        block, head = name.split(".h")
        w = np.asarray(cache[f"blocks.{block}.mixer.attention.weights"], np.float64)[:, int(head), pos, :pos + 1]
        looks[name] = (words[int(np.argmax(w.mean(0)))], float(w.mean(0).max()))
    return {"k": found.k, "faithfulness": found.faithfulness, "edges": found.edges,
            "words": describe(found.edges, looks), "kind": kind}


def describe(edges: list[str], looks: dict) -> str:
    """A circuit in words: per receiver, what feeds it; where each head in it looks from the referent."""
    from attention_jax.analysis.edges import receiver_node
    def node(n):
        if n == "embed":
            return "the words themselves"
        block, part = n.split(".")
        if part.startswith("h"):
            at = f" (looking at {looks[n][0]}, {looks[n][1]:.2f})" if n in looks else ""
            return f"block {int(block) + 1} head {part[1:]}{at}"
        return f"block {int(block) + 1}'s {'FFN' if part == 'ffn' else part}"
    into = {}
    for e in edges:
        sender, receiver = e.split("->")
        into.setdefault(receiver, []).append(node(sender))
    said = []
    for receiver, senders in into.items():
        target, role = receiver_node(receiver)
        if receiver == "logits":
            said.append(f"the answer is written by {', '.join(senders)}")
        elif role:                                  # a head's query, key or value
            said.append(f"{node(target)} takes its {ROLE[role]} from {', '.join(senders)}")
        else:
            said.append(f"{node(receiver)} reads {', '.join(senders)}")
    return "; ".join(said) or "no edge"


def found_per_test(models, tasks) -> dict:
    """Per test, the circuit found in each seed's model: seed 0's whole, and every seed's size and faithfulness."""
    out = {}
    for kind in KINDS:
        per = [found(m, t, kind) for m, t in zip(models, tasks)]
        out[kind] = {"seed0": per[0], "k": [d["k"] for d in per], "faithfulness": [d["faithfulness"] for d in per]}
    return out


def found_table(circuits: dict, pools: list | None = None) -> str:
    """A row per test (per pool, given `pools`: [(pool, circuits)]): the circuit's size per seed, its least
    faithfulness, and seed 0's circuit in words."""
    from experiments.harness import report
    size = lambda k, f: str(k) if k else NOT_MEASURABLE if np.isnan(f) else f">{MOST_EDGES}"
    rows = [{"pool": pool, "test": kind, "k": ", ".join(size(k, f) for k, f in zip(c["k"], c["faithfulness"])),
             "faithful": min(c["faithfulness"]), "words": c["seed0"]["words"]}
            for pool, per in (pools or [(None, circuits)]) for kind, c in per.items()]
    columns = ([("pool", "pool", "")] if pools else []) + [
        ("test", "test", ""), ("k", "edges kept, per seed", ""), ("faithful", "least faithfulness", ".2f"),
        ("words", "seed 0's circuit, in words", "")]
    return report.format_table(columns, rows)


def worst(per_seed: list[dict]) -> dict:
    """Across seeds, each claim's figure at its worst seed (a claim is about every model), with every seed's."""
    low = ("keep_referent", "keep_first", "fetch_second", "read_adjective", "read_best_head")
    high = ("fetch_referent", "read_referent")
    # A seed whose figure is not measurable (NaN) makes the claim's figure not measurable, whatever the others.
    pick = lambda k, f: float("nan") if any(np.isnan(d[k]) for d in per_seed) else float(f(d[k] for d in per_seed))
    return {**{k: pick(k, min) for k in low}, **{k: pick(k, max) for k in high},
            **{f"{k}_seeds": [d[k] for d in per_seed] for k in low + high}}


def table(demo: dict) -> str:
    """Seed 0: the share of the clean answer each slot brings back entering block 2, per test."""
    from experiments.harness import report
    words = demo["words"]
    names = {"keep": "keep (first noun swapped)", "fetch": "fetch (second noun swapped)",
             "read": "read (adjective swapped)"}
    rows = [{"test": names[k], **{f"{i}": f"{v:.2f}" for i, v in enumerate(demo[k]["restored"][:len(words)])}}
            for k in names]
    return report.format_table([("test", "test", "")] + [(f"{i}", f"{i} {w}", "") for i, w in enumerate(words)],
                               rows)
