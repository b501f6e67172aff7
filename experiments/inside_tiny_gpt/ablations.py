"""Demo 6: the lecture's ablations and every single head, with their claims."""
from __future__ import annotations

import math

from attention_jax.config import ModelConfig
from experiments.harness import report
from experiments.inside_tiny_gpt.constants import LECTURE
from experiments.inside_tiny_gpt.evaluate import compiled, greedy_accuracy, model_bits, teacher_forced_accuracy


def ablation_list(cfg: ModelConfig) -> list[tuple[str, str, dict]]:
    """(key, description, inspect.ablate keywords): the lecture's five, then every single head."""
    out = [("intact", "the trained model", {}),
           ("positions", "position vectors zeroed", {"positions": True})]
    out += [(f"attention {i}", f"layer {i}'s attention off", {"mixer": [i]}) for i in range(cfg.n_layers)]
    out += [(f"mlp {i}", f"layer {i}'s MLP off", {"feed_forward": [i]}) for i in range(cfg.n_layers)]
    out += [("bidirectional", "causal -> bidirectional mask", {"bidirectional": True})]
    out += [(f"head {i}.{h}", f"head {i}.{h} off (its output zeroed)", {"heads": {i: [h]}})
            for i in range(cfg.n_layers) for h in range(cfg.heads_used)]
    return out


def head_mask(cfg: ModelConfig, heads: dict):
    """keep [L, H] float32: 0 for the heads {block: [head, ...]} to switch off, 1 elsewhere."""
    import numpy as np
    keep = np.ones((cfg.n_layers, cfg.heads_used), np.float32)
    for block, hs in heads.items():
        keep[block, list(hs)] = 0.0
    return keep


def run_ablations(models, tok, world, vx, vy) -> list[dict]:
    """Every ablation (inspect.ablate) on every seed's model: validation bits/char and fact accuracy.

    Fact accuracy is teacher-forced under a causal mask (= greedy, checked on the intact
    model by the caller) and greedy decoding for the bidirectional row, where a teacher-forced
    pass would show the model the answer.
    """
    import numpy as np
    from attention_jax.analysis.inspect import ablate
    from attention_jax.train.loop import mean_std
    cfg = models[0].config
    rows = []
    for key, label, kw in ablation_list(cfg):
        bpc, acc = [], []
        for model in models:
            if set(kw) == {"heads"}:      # as data: one compile for every head (test: = inspect.ablate)
                keep = head_mask(cfg, kw["heads"])
                forward = lambda m, x: compiled().forward_heads(m, x, keep)
                bpc.append(model_bits(model, vx, vy, forward))
                acc.append(teacher_forced_accuracy(model, tok, world, forward))
                continue
            with ablate(model, **kw):
                bpc.append(model_bits(model, vx, vy))
                acc.append(greedy_accuracy(model, tok, world, bidirectional=True) if kw.get("bidirectional")
                           else teacher_forced_accuracy(model, tok, world))
        lec = LECTURE.get(key, (None, None))
        rows.append(dict(key=key, ablation=label, bpc=float(np.mean(bpc)), bpc_seeds=bpc,
                         bpc_std=mean_std(bpc)[1],
                         acc=float(np.mean(acc)), acc_seeds=acc, lecture_bpc=lec[0], lecture_acc=lec[1]))
    base = rows[0]["bpc"]
    for r in rows:
        r["change"] = r["bpc"] - base if r["key"] != "intact" else None
    uniform = math.log2(cfg.vocab_size)
    rows.insert(1, dict(key="uniform", ablation=f"uniform over {cfg.vocab_size} symbols (nothing learned)",
                        bpc=uniform, bpc_seeds=[uniform] * len(models), acc=0.0, acc_seeds=[0.0] * len(models),
                        change=uniform - base, lecture_bpc=LECTURE["uniform"][0], lecture_acc=LECTURE["uniform"][1]))
    return rows


# --- claims ------------------------------------------------------------------------------------

def ablation_claims(r: dict) -> list[dict]:
    """The ablation claims on {key: row} (seed means, or one seed's figures under claims_across_seeds)."""
    out = []
    full = r["intact"]
    if "positions" in r:
        cost = r["positions"]["bpc"] - full["bpc"]
        out.append(report.claim("zeroing the positions costs bits/char", cost > 0,
                                f"{r['positions']['bpc']:.3f} vs {full['bpc']:.3f} bits/char ({cost:+.3f}; "
                                f"lecture 5.022 vs 0.409)", cost))
    layers = sorted(k for k in r if k.startswith("attention "))
    if layers:
        worst = min(layers, key=lambda k: r[k]["acc"])
        half = 0.5 * full["acc"]
        out.append(report.claim("one layer's attention off drops fact accuracy by more than half",
                                r[worst]["acc"] < half,
                                ", ".join(f"{k} off {r[k]['acc']:.3f}" for k in layers)
                                + f" vs intact {full['acc']:.3f} (lecture: attention 1 off 0.05 vs 0.93)",
                                half - r[worst]["acc"]))
    if "bidirectional" in r:
        worse = r["bidirectional"]["bpc"] - full["bpc"]
        out.append(report.claim("the bidirectional mask does worse than causal on validation", worse > 0,
                                f"{r['bidirectional']['bpc']:.3f} vs {full['bpc']:.3f} bits/char "
                                f"(lecture 7.528 vs 0.409)", worse))
    return out
