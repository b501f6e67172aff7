"""`--pools K`: every claim checked again on K - 1 word pools drawn from built-in lists, and the tables
that set the pools side by side."""
from __future__ import annotations

from experiments.harness import report
from experiments.winograd import causal
from experiments.winograd.attention import claims
from experiments.winograd.constants import ROWS
from experiments.winograd.figures import pct
from experiments.winograd.pool import train_pool


def other_pools(ctx, table, spec, check: dict) -> list[dict]:
    """Every claim on --pools word pools: pool 0 is the one trained already, the others drawn and trained."""
    from attention_jax.data import winograd as wg
    pools = [(0, spec, check)] + [(k, wg.draw_pool(k), None) for k in range(1, ctx.args.pools)]
    found = []
    for k, words, check_k in pools:
        if check_k is None:
            print(f"pool {k}: {', '.join(words.nouns)}; {', '.join(a for a, _ in words.adjectives)}", flush=True)
            check_k = train_pool(ctx, table, words)["check"]
        found.append({"pool": k, "nouns": list(words.nouns), "adjectives": [list(a) for a in words.adjectives],
                      "claims": report.claims_across_seeds(claims, check_k, len(ctx.seeds)),
                      "accuracy": {n: pct(check_k[n], "accuracy") for n in ROWS if n in check_k},
                      "attention": {k_: v for k_, v in check_k.get("attention", {}).items()
                                    if k_.startswith("block") and not k_.endswith("_seeds")},
                      "causal": {k_: v for k_, v in check_k.get("causal", {}).items() if isinstance(v, float)},
                      "found": check_k.get("found", {})})
    return found


def pools_tables(found: list[dict], n_pools: int, n_seeds: int) -> dict[str, str]:
    tables = {f"Each claim on {n_pools} word pools (0: the book's), {n_seeds} seed(s) each": pools_table(found)}
    if all(p["attention"] for p in found):
        tables["Two blocks at the referent, per word pool (worst seed)"] = pools_attention_table(found)
    if all(p["causal"] for p in found):
        tables["Patching entering block 2, per word pool (worst seed): the share of the clean answer one slot "
               "brings back"] = pools_causal_table(found)
    if all(p["found"] for p in found):
        tables["The circuit edge patching finds, per word pool and test"] = \
            causal.found_table({}, [(p["pool"], p["found"]) for p in found])
    return tables


def pools_table(found: list[dict]) -> str:
    """A row per claim: its verdict and margin on each pool, in how many pools x seeds it held, the least margin."""
    rows = []
    for j, c in enumerate(found[0]["claims"]):
        row = {"claim": c["claim"]}
        for p in found:
            v = p["claims"][j]
            margin = report.held_across([v])[2]
            row[f"pool {p['pool']}"] = f"{report.verdict(v)} ({margin:.3g})" if margin is not None else report.verdict(v)
        held, of, row["least"] = report.held_across([p["claims"][j] for p in found])
        row["held"] = f"{held} of {of}"
        rows.append(row)
    return report.format_table([("claim", "claim", "")] + [(f"pool {p['pool']}", f"pool {p['pool']}", "")
                                                            for p in found]
                               + [("held", "held (pools x seeds)", ""), ("least", "least margin", ".3g")], rows)


def pools_attention_table(found: list[dict]) -> str:
    """Per pool: how much block 1 reads the adjective, and whether the last block looks at the picked noun."""
    rows = [{"pool": p["pool"], "nouns": ", ".join(p["nouns"][:4]) + ", ...", **p["attention"],
             **{n: p["accuracy"].get(n) for n in ("clean_one_block", "clean_two_blocks")}} for p in found]
    return report.format_table([("pool", "pool", ""), ("nouns", "nouns", ""),
                                ("clean_one_block", "one block %", ""), ("clean_two_blocks", "two blocks %", ""),
                                ("block1_adjective_weight", "block 1: most weight on the adjective", ".3f"),
                                ("block1_pair_diff", "block 1: the demo pair's rows differ by", ".3f"),
                                ("block2_shift", "block 2: weight moved by the adjective", ".3f"),
                                ("block2_pick_margin", "block 2: picked noun minus other, least", ".3f")], rows)


def pools_causal_table(found: list[dict]) -> str:
    """Per pool: what patching one slot entering block 2 brings back, for each test of the story."""
    rows = [{"pool": p["pool"], **p["causal"]} for p in found]
    return report.format_table([("pool", "pool", ""), ("keep_referent", "keep: referent", ".2f"),
                                ("keep_first", "keep: first noun", ".2f"),
                                ("fetch_second", "fetch: second noun", ".2f"),
                                ("fetch_referent", "fetch: referent", ".2f"),
                                ("read_adjective", "read: adjective", ".2f"), ("read_referent", "read: referent", ".2f"),
                                ("read_best_head", "read: best head of block 2", ".2f")], rows)
