"""`run`: each compiled program, each method's circuits against its true circuit, the tables and claims."""
from __future__ import annotations

import numpy as np

from experiments.circuits_known import roc
from experiments.circuits_known.programs import built
from experiments.harness import report
from experiments.harness.experiment import Result
from experiments.harness.oracles import NOT_MEASURED, absent, missing

ORACLES = ("tracr", "haiku")
# The ACDC paper's tracr AUCs, edges (Conmy et al. 2023; its repository's experiments/results/auc_tables.tex,
# squared-error metric): "random" is its resample ablation. reverse and frac_prevs ("proportion") only.
PAPER = {("reverse", "resample"): {"ACDC": 0.200, "HISP": 0.656, "SP": 0.416},
         ("frac_prevs", "resample"): {"ACDC": 0.600, "HISP": 0.679, "SP": 0.400},
         ("reverse", "zero"): {"ACDC": 1.000, "HISP": 0.656, "SP": 0.692},
         ("frac_prevs", "zero"): {"ACDC": 1.000, "HISP": 0.679, "SP": 0.561}}
ABLATIONS = ("resample", "zero")
TRUE_ALONE = 0.99      # the claims, written before the first run: the true circuit alone recovers this share
EXACT_AUC = 0.9        # zero ablation: exact edge patching's AUC on every program at least this
CLOSE = 0.1            # EAP-IG-inputs within this of exact's AUC; ACDC within this of the paper's


def methods(program: dict, ablation: str, steps: int, thresholds) -> dict:
    """Each method's circuits on one program: {method: (list of circuits, seconds)}; a score's circuits are
    its top k for every k, ACDC's one per threshold (a share of the whole clean-corrupted change)."""
    import time
    from attention_jax.analysis import attribution, discovery, pruning
    from attention_jax.analysis.metrics import squared_error
    model, clean, corrupted = program["model"], program["clean"], program["corrupted"]
    metric = squared_error(model, clean)
    scorers = {"exact": lambda: discovery.edge_patch(model, clean, corrupted, metric, ablation=ablation),
               "EAP": lambda: attribution.edge_attribution(model, clean, corrupted, metric, ablation=ablation)}
    if ablation == "resample":      # EAP-IG moves the clean run towards the corrupted one: resampling's alone
        scorers |= {f"EAP-IG-{over}": (lambda over: lambda: attribution.eap_ig(
            model, clean, corrupted, metric, steps=steps, over=over))(over) for over in ("inputs", "activations")}
    every = range(len(discovery.prepare(model, clean, corrupted, metric).graph.edges))
    whole = float(discovery.patch_paths(model, clean, corrupted, metric, every, ablation=ablation)[0])
    out = {}
    for name, score in scorers.items():
        start = time.perf_counter()
        scores = score()
        out[name] = (ranked(scores, pruning.circuit, whole), time.perf_counter() - start)
    start = time.perf_counter()
    out["ACDC"] = ([pruning.acdc(model, clean, corrupted, metric, threshold=t * whole, ablation=ablation)
                    for t in thresholds], time.perf_counter() - start)
    return out


TIE = 1e-6      # |effects| below this share of the whole change are float32 rounding of zero: tied there


def ranked(scores, circuit, whole: float) -> list[list[str]]:
    """A score's circuits, one a distinct |effect| from the largest down (tied edges enter together, so a
    tie is never broken by the edges' order, nor by rounding: see TIE), and the empty one."""
    size = np.abs(scores.effect)
    size = np.where(size < TIE * abs(whole), 0.0, size)
    return [[]] + [circuit(scores.__class__(scores.graph, size, scores.method, scores.clean), threshold=float(v))
                   for v in np.unique(size)[::-1]]


def judged(name: str, program: dict, ablation: str, found: dict) -> list[dict]:
    """A row per method: its AUC, and its circuit of the true circuit's size alone (faithfulness)."""
    from attention_jax.analysis import edges
    from attention_jax.analysis.faithfulness import circuit_faithfulness
    from attention_jax.analysis.metrics import squared_error
    model, true = program["model"], program["true"]
    every = edges.graph_of(model).names()
    metric = squared_error(model, program["clean"])
    sized = {m: min(cs, key=lambda c: (abs(len(c) - len(true)), len(c))) for m, (cs, _) in found.items()}
    alone = circuit_faithfulness(model, program["clean"], program["corrupted"], metric, sorted(true),
                                 *sized.values(), ablation=ablation)
    rows = [dict(program=name, ablation=ablation, method="the true circuit", edges=len(true), of=len(every),
                 auc=1.0, faithfulness=float(alone[0]), recall=1.0, paper="")]
    for (method, (circuits, seconds)), f in zip(found.items(), alone[1:]):
        c, points = sized[method], roc.curve(circuits, true, every)
        rows.append(dict(program=name, ablation=ablation, method=method, edges=len(c), of=len(every), s=seconds,
                         auc=roc.area(points), faithfulness=float(f), recall=len(set(c) & true) / len(true),
                         paper=PAPER.get((name, ablation), {}).get(method, ""), curve=points))
    return rows


def figure(curves: dict) -> object:
    """The ROC curves: a panel per program and ablation, a line per method."""
    keys = list(curves)
    fig, axes = report.figure(ncols=len(keys), size=(3.6 * len(keys), 3.6), squeeze=False)
    for ax, (name, ablation) in zip(axes[0], keys):
        for i, (method, points) in enumerate(curves[(name, ablation)].items()):
            ax.step([x for x, _ in points], [y for _, y in points], where="post", color=f"C{i}", label=method)
        ax.plot([0, 1], [0, 1], color="0.7", lw=0.8)
        ax.set(xlabel="false positive rate (edges)", ylabel="true positive rate", title=f"{name}, {ablation}")
    axes[0][0].legend(fontsize=7)
    return fig


def claims(rows: list[dict], answered: dict, gone) -> list[dict]:
    """The claims, written before the first run (docs/results/notes/circuits_known.md says so)."""
    texts = ["every compiled program, in our modules, answers as RASP evaluates it on every input",
             f"each true circuit alone recovers at least {TRUE_ALONE:.0%} of the clean-corrupted change",
             f"zero ablation: exact edge patching's ROC AUC is at least {EXACT_AUC} on every program",
             "resample ablation hides edges that carry the same value in every input: exact patching's AUC on "
             "reverse is below its zero-ablation AUC",
             f"resample ablation: EAP-IG-inputs' AUC is within {CLOSE} of exact patching's on every program",
             f"zero ablation: ACDC's AUC is within {CLOSE} of the paper's on reverse and frac_prevs"]
    if gone:
        return [report.unchecked(report.claim(t, False, NOT_MEASURED), absent(gone)) for t in texts]
    auc = {(r["program"], r["ablation"], r["method"]): r for r in rows}
    names = sorted({r["program"] for r in rows})
    true = min(r["faithfulness"] for r in rows if r["method"] == "the true circuit")
    exact = min(auc[(n, "zero", "exact")]["auc"] for n in names)
    hide = auc.get(("reverse", "resample", "exact"), {}).get("auc", np.nan), \
        auc.get(("reverse", "zero", "exact"), {}).get("auc", np.nan)
    ig = max(abs(auc[(n, "resample", "EAP-IG-inputs")]["auc"] - auc[(n, "resample", "exact")]["auc"]) for n in names)
    paper = [abs(auc[(n, "zero", "ACDC")]["auc"] - PAPER[(n, "zero")]["ACDC"]) for n in ("reverse", "frac_prevs")
             if (n, "zero", "ACDC") in auc]
    worst = max(paper) if paper else np.nan
    return [report.claim(texts[0], all(answered.values()), f"{sum(answered.values())} of {len(answered)} programs"),
            report.claim(texts[1], true >= TRUE_ALONE, f"least {true:.3f}", true - TRUE_ALONE),
            report.claim(texts[2], exact >= EXACT_AUC, f"least {exact:.3f}", exact - EXACT_AUC),
            report.claim(texts[3], hide[0] < hide[1], f"{hide[0]:.3f} vs {hide[1]:.3f}", hide[1] - hide[0]),
            report.claim(texts[4], ig <= CLOSE, f"largest difference {ig:.3f}", CLOSE - ig),
            report.claim(texts[5], worst <= CLOSE, f"largest difference {worst:.3f}", CLOSE - worst)]


COLUMNS = [("program", "program", ""), ("ablation", "ablation", ""), ("method", "method", ""),
           ("auc", "ROC AUC (edges)", ".3f"), ("paper", "the ACDC paper's", ".3f"),
           ("edges", "circuit of the true size: edges", "d"), ("of", "of", "d"), ("recall", "true edges in it", ".2f"),
           ("faithfulness", "its faithfulness", ".3f"), ("s", "seconds", ".1f")]


def run(ctx) -> Result:
    p, gone, rows, answered, truths = ctx.settings, missing(*ORACLES), [], {}, {}
    if gone:
        print(f"tracr's compiled programs: {NOT_MEASURED}, {absent(gone)} (pip install tracr-pypi dm-haiku)")
        return Result(rows=[], claims=claims([], {}, gone), tables={}, config=dict(p))
    for name in p["programs"]:
        program = built(name, p["inputs"])
        answered[name], truths[name] = program["answers"], sorted(program["true"])
        for ablation in ABLATIONS:
            found = methods(program, ablation, p["steps"], p["thresholds"])
            for r in judged(name, program, ablation, found):
                rows.append(r)
                print(f"  {name:<11} {ablation:<8} {r['method']:<19} AUC {r['auc']:.3f}  "
                      f"faithfulness {r['faithfulness']:.3f}", flush=True)
    curves = {}
    for r in rows:
        if "curve" in r:
            curves.setdefault((r["program"], r["ablation"]), {})[r["method"]] = r["curve"]
    return Result(rows=rows, claims=claims(rows, answered, gone), config=dict(p, programs=list(p["programs"])),
                  tables={"Each method's circuits against the true circuit": report.format_table(COLUMNS, rows)},
                  figures={"roc.png": figure(curves)}, extra={"true_edges": truths, "answers": answered})
