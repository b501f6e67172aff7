"""The IOI circuit in GPT-2 small, found by edge attribution, beside the heads Wang et al. (2022) name.

`python -m experiments.ioi` reads GPT-2 small's own weights (`pretrained.fetch`: the Hugging Face
hub, or a folder by `--model`), makes indirect-object prompts and their "ABC" corruptions
(`experiments.ioi_prompts`), scores every edge of the model's graph (32,491) by EAP-IG over the
inputs (Hanna et al. 2024: MIB's EAP-IG-inputs, 5 steps) and, on an accelerator (the paper
preset), by exact edge patching too, on the logit difference between the indirect object and the
subject, normalised. It reports where the paper's heads rank among the 144 (name movers 9.6, 9.9,
10.0; S-inhibition 7.3, 7.9, 8.6, 8.10; induction 5.5, 6.9; duplicate-token 0.1, 3.0;
previous-token 2.2, 4.11; the lists of ACDC's `acdc/ioi/utils.py`), and MIB's CPR and CMD of each
score. Where the weights cannot be fetched (no network), it runs on GPT-2 small's shape with random
weights and a word-level stand-in for its tokenizer: the plumbing only, its figures mean nothing,
and every claim is "not checked".
"""
from __future__ import annotations

import numpy as np

from experiments.harness import report
from experiments.harness.experiment import Experiment, Result
from experiments.ioi_prompts import prompts, words

NAME = "ioi"
PRESETS = {"smoke": dict(model="tiny", prompts=8, steps=2, exact=True),
           "cpu": dict(model="gpt2", prompts=16, steps=5, exact=False),
           "paper": dict(model="gpt2", prompts=64, steps=5, exact=True)}
HEADS = {"name mover": ("9.6", "9.9", "10.0"), "S-inhibition": ("7.3", "7.9", "8.6", "8.10"),
         "induction": ("5.5", "6.9"), "duplicate token": ("0.1", "3.0"), "previous token": ("2.2", "4.11")}
TOP = 10        # the claims, written before any run with the real weights: each name mover in the top TOP heads
CPR_AT_LEAST = 0.5
NOT_MEASURABLE = "not measurable"
RANDOM = "GPT-2 small's shape with random weights (its own could not be fetched): plumbing, figures mean nothing"


def flags(p) -> None:
    p.add_argument("--model", default=None, metavar="NAME|FOLDER",
                   help="GPT-2's hub name or a folder of its files (default: the preset's)")


def loaded(source: str):
    """(model, encode, real): GPT-2's own where it can be had; else its shape, random, a word tokenizer."""
    from attention_jax import pretrained
    from attention_jax.errors import DataError
    if source != "tiny":
        try:
            folder = pretrained.fetch(source) if source == "gpt2" else source
            tok = pretrained.tokenizer(folder)
            return pretrained.load(folder), lambda text: tok.encode(text).ids, True
        except DataError as e:
            print(f"note: {e}; {RANDOM}", flush=True)
    return _random(source), _word_ids(), False


def _random(source: str):
    from flax import nnx
    from attention_jax.config import GPT2_SMALL
    from attention_jax.model import LanguageModel
    import dataclasses
    shape = GPT2_SMALL if source != "tiny" else dataclasses.replace(GPT2_SMALL, d_model=64, n_layers=2, n_heads=4,
                                                                     vocab_size=512, context=32)
    return LanguageModel(dataclasses.replace(shape, init="gpt2"), rngs=nnx.Rngs(0))


def _word_ids():
    table = {}
    return lambda text: [table.setdefault(w, len(table)) for w in words(text)]


def batch(encode, n: int):
    """Clean and corrupted ids [B, T], IO and S ids [B]: the prompts whose texts and names encode to one
    length each (a name of two tokens would shift every position after it)."""
    made = prompts(4 * n)
    ids = [(encode(p["text"]), encode(p["corrupted"]), encode(" " + p["io"]), encode(" " + p["s"])) for p in made]
    usual = max(set(len(c) for c, *_ in ids), key=[len(c) for c, *_ in ids].count)
    keep = [x for x in ids if len(x[0]) == len(x[1]) == usual and len(x[2]) == len(x[3]) == 1][:n]
    clean, corrupted, io, s = (np.asarray([x[i] for x in keep]) for i in range(4))
    return clean, corrupted, io[:, 0], s[:, 0]


def head_ranks(scores) -> dict[str, int]:
    """Each head's rank (1 = first) among all heads by the summed |score| of the edges out of it."""
    total = {}
    for name, value in zip(scores.graph.names(), np.abs(scores.effect)):
        sender = name.split("->")[0]
        if ".h" in sender:
            total[sender] = total.get(sender, 0.0) + float(value)
    order = sorted(total, key=lambda h: -total[h])
    return {h.replace(".h", "."): i + 1 for i, h in enumerate(order)}


def scored(model, clean, corrupted, metric, p) -> dict:
    """Each score's edges, heads' ranks and MIB's CPR and CMD."""
    from attention_jax.analysis.attribution import eap_ig
    from attention_jax.analysis.discovery import edge_patch
    out = {"EAP-IG-inputs": eap_ig(model, clean, corrupted, metric, steps=p["steps"])}
    if p["exact"]:
        out["exact"] = edge_patch(model, clean, corrupted, metric)
    return {m: {"ranks": head_ranks(s), **_areas(model, clean, corrupted, metric, s), "edges": len(s.effect)}
            for m, s in out.items()}


def _areas(model, clean, corrupted, metric, scores) -> dict:
    """MIB's CPR and CMD, or why they are not measurable (a gap within its noise: a random model's)."""
    from attention_jax.analysis import mib
    from attention_jax.errors import NotMeasurable
    try:
        return mib.cpr_cmd(model, clean, corrupted, metric, scores)
    except NotMeasurable as e:
        print(f"note: CPR and CMD not measurable: {e}", flush=True)
        return {"sizes": [], "k": [], "cpr_curve": [], "cmd_curve": [], "cpr": NOT_MEASURABLE, "cmd": NOT_MEASURABLE}


def claims(found: dict, real: bool) -> list[dict]:
    texts = [f"every name mover the paper names (9.6, 9.9, 10.0) is among the top {TOP} heads by EAP-IG",
             f"EAP-IG's circuits reach a CPR of at least {CPR_AT_LEAST} (MIB's area)"]
    ig = found.get("EAP-IG-inputs")
    if not real or ig is None:
        return [report.unchecked(report.claim(t, False, "not run with GPT-2's own weights"),
                                 "GPT-2's weights could not be fetched here: the run used random ones")
                for t in texts]
    worst = max(ig["ranks"].get(h, 10**6) for h in HEADS["name mover"])
    cpr = report.claim(texts[1], False, f"{NOT_MEASURABLE}: the gap is within its noise") \
        if ig["cpr"] == NOT_MEASURABLE else \
        report.claim(texts[1], ig["cpr"] >= CPR_AT_LEAST, f"CPR {ig['cpr']:.3f}", ig["cpr"] - CPR_AT_LEAST)
    return [report.claim(texts[0], worst <= TOP, f"worst rank {worst}", TOP - worst), cpr]


def run(ctx) -> Result:
    from attention_jax.analysis.metrics import normalized_logit_diff
    p = dict(ctx.settings, model=ctx.args.model or ctx.settings["model"])
    model, encode, real = loaded(p["model"])
    clean, corrupted, io, s = batch(encode, p["prompts"])
    metric = normalized_logit_diff(model, clean, corrupted, io, s)
    found = scored(model, clean, corrupted, metric, p)
    rows = [dict(kind="head", **{"class": c, "head": h}, **{m: f["ranks"].get(h) for m, f in found.items()})
            for c, heads in HEADS.items() for h in heads]
    rows += [dict(kind="mib", method=m, edges=f["edges"], cpr=f["cpr"], cmd=f["cmd"]) for m, f in found.items()]
    weights = "GPT-2 small's own" if real else RANDOM
    head_cols = [("class", "class (Wang et al. 2022)", ""), ("head", "head", "")] + \
        [(m, f"rank by {m} (of 144)", "d") for m in found]
    tables = {f"The paper's heads among all heads ({weights}, {len(clean)} prompts)":
              report.format_table(head_cols, [r for r in rows if r["kind"] == "head"]),
              "MIB's CPR and CMD": report.format_table([("method", "method", ""), ("edges", "edges", "d"),
                                                        ("cpr", "CPR", ".3f"), ("cmd", "CMD", ".3f")],
                                                       [r for r in rows if r["kind"] == "mib"])}
    return Result(rows=rows, claims=claims(found, real), tables=tables,
                  config=dict(p, weights=weights, real_weights=real, gap=metric.clean - metric.corrupted),
                  extra={"curves": {m: {k: f[k] for k in ("sizes", "k", "cpr_curve", "cmd_curve")}
                                    for m, f in found.items()}})


EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run, flags=flags)
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
