"""The lecture's demos on the trained tiny GPT, one function each, in the lecture's order.

Each adds its tables, figures, claims and kept figures to one `Sheet`, prints what the lecture
shows on screen, and returns what a later demo or the summary reads.
"""
from __future__ import annotations

import dataclasses

from experiments.harness import report
from experiments.inside_tiny_gpt.ablations import ablation_claims, ablation_list, run_ablations
from experiments.inside_tiny_gpt.anatomy import demo_params, forward_check, residual_norms
from experiments.inside_tiny_gpt.attention import (
    ascii_heatmap, attention_demo, heatmap_figure, sqrt_d_random, sqrt_d_trained)
from experiments.inside_tiny_gpt.constants import (
    CONFIG, RAW_FORWARD_RTOL, REVIEW, SHADES, SQRT_D_KEYS, SQRT_D_PAIRS, SQRT_D_ROWS, SQRT_D_SEED)
from experiments.inside_tiny_gpt.figures import ablation_figure, residual_figure, sqrt_d_figure


@dataclasses.dataclass
class Sheet:
    """What the demos add up to, in the order they ran: tables, figures, claims, and the figures
    results.json keeps beside them (`extra`)."""
    tables: dict = dataclasses.field(default_factory=dict)
    figures: dict = dataclasses.field(default_factory=dict)
    claims: list = dataclasses.field(default_factory=list)
    extra: dict = dataclasses.field(default_factory=dict)


def parameters(sheet: Sheet, model) -> None:
    """Demo 1: the parameters by formula and by the framework, and GPT-3 by 12·L·d²."""
    prows, gpt3, shares = demo_params(model)
    sheet.tables["1. Parameters by formula and by the framework (parameters.param_breakdown)"] = report.format_table(
        [("part", "component", ""), ("formula", "formula", ""), ("by_formula", "by formula", ",d"),
         ("framework", "framework", ",d"), ("equal", "equal", ""), ("lecture", "lecture", ",d")], prows) + (
        f"\n\nPer block the MLP holds {shares['mlp_share_of_block']:.0%} and attention "
        f"{shares['attention_share_of_block']:.0%}; the two tables hold {shares['embeddings_share']:.1%} of the "
        f"model (lecture 8.2%); an untied output would add V·d = {shares['untied_would_add']:,} "
        f"({shares['untied_share']:.1%}).")
    sheet.tables["1b. GPT-3 by 12·L·d² (d 12,288, L 96, V 50,257, T 2,048)"] = report.format_table(
        [("part", "part", ""), ("count", "parameters", ",d"), ("billions", "billions", ".2f"),
         ("lecture", "lecture", "")], gpt3) + (
        f"\n\nThe embeddings are {shares['gpt3_embeddings_share']:.2%} of GPT-3 (lecture ≈0.37%) "
        f"against {shares['embeddings_share']:.1%} here.")
    total = prows[-1]
    mismatched = [r["part"] for r in prows if not r["equal"]]
    sheet.claims.append(report.claim(
        "parameters by formula = the framework's count, component by component", not mismatched,
        f"{total['by_formula']:,} by formula, {total['framework']:,} counted; "
        f"{len(prows) - len(mismatched)} of {len(prows)} rows equal (lecture 109,056)",
        -float(sum(abs(r["by_formula"] - r["framework"]) for r in prows if isinstance(r["framework"], int)))))
    sheet.extra.update(parameters=prows, gpt3=gpt3, shares=shares)


def forward(sheet: Sheet, model, tok, person) -> tuple[str, list[int]]:
    """Demo 2: the forward pass from the raw weight arrays, shapes printed at every step, against the
    module's logits; returns the prompt and its ids (demo 3 reads the same prompt)."""
    import numpy as np
    from attention_jax import functional as F
    from attention_jax.data import tiny_world as tw
    prompt = f"\n{person.name} lives in "
    ids = tok.encode(prompt)
    print(f"\nforward pass from the raw weights on {tw.show(prompt)!r} (T = {len(ids)}):", flush=True)
    steps = []

    def say(step, shape):
        steps.append(dict(step=step, shape=str(tuple(int(s) for s in shape))))
        print(f"  {step:<62} {tuple(int(s) for s in shape)}", flush=True)

    check = forward_check(model, ids, say)
    probs = np.asarray(F.masked_softmax(check["logits"][-1]))
    top5 = np.argsort(-probs, kind="stable")[:5]
    next_text = "  ".join(f"{tw.show(tok.alphabet[i])!r} {probs[i]:.3f}" for i in top5)
    print(f"  max |raw - module| = {check['max_abs_diff']:.2e} (logits up to {check['logit_scale']:.1f}); "
          f"next character: {next_text}", flush=True)
    sheet.tables["2. Forward pass from the raw weights (plain jnp on param[...] arrays)"] = report.format_table(
        [("step", "step", ""), ("shape", "shape", "")], steps) + (
        f"\n\nPrompt {tw.show(prompt)!r} ({person.name} lives in {person.city}). Max |raw - module| = "
        f"{check['max_abs_diff']:.2e} with logits up to {check['logit_scale']:.1f} (lecture: ~1e-5). "
        f"Next character, top 5: {next_text}.")
    # float32 rounding grows with the logits' size (two orders of the same sums), so the bound is
    # relative to the largest logit: 1e-6 of it, about eight float32 epsilons.
    bound = RAW_FORWARD_RTOL * max(1.0, check["logit_scale"])
    sheet.claims.append(report.claim(
        f"the forward pass from the raw weights = the module's logits, to float32 rounding "
        f"(max |diff| <= {RAW_FORWARD_RTOL:g} x the largest |logit|)", check["max_abs_diff"] <= bound,
        f"max |diff| {check['max_abs_diff']:.2e} with logits up to {check['logit_scale']:.1f} "
        f"(bound {bound:.2e}; lecture ~1e-5 with logits in the tens)", bound - check["max_abs_diff"]))
    sheet.extra["forward"] = {"max_abs_diff": check["max_abs_diff"], "steps": steps, "top5": next_text}
    return prompt, ids


def residual(sheet: Sheet, model, ids, prompt: str, preset: str) -> None:
    """Demo 3: what each component writes into the residual stream, and the stream after it."""
    from attention_jax.data import tiny_world as tw
    norms = residual_norms(model, ids)
    sheet.tables["3. The residual stream: what each component writes, and the stream after it (L2 norms)"] = \
        report.format_table([("component", "component", ""), ("writes", "writes (last position)", ".2f"),
                             ("stream", "stream after (last position)", ".2f"),
                             ("writes_mean", "writes (mean over positions)", ".2f"),
                             ("lecture", "lecture, writes", "")], norms) + (
        "\n\nSame prompt as demo 2; the last position is the one that predicts the city's first letter.")
    sheet.figures["residual.png"] = residual_figure(norms, f"residual stream on {tw.show(prompt)!r} ({preset} preset)")
    sheet.extra["residual"] = norms


def attention(sheet: Sheet, model, tok, person, folder, preset: str) -> None:
    """Demo 4: where the heads look on a fact question: the viewer, exact zeros on the future, the head
    that reads the name most, as ASCII and PNG heatmaps."""
    import numpy as np
    from attention_jax.analysis.viewer import AttentionView
    from attention_jax.data import tiny_world as tw
    att = attention_demo(model, tok, person.name)
    AttentionView(np.stack(att["layers"]), att["chars"], title=f"tiny GPT on the question ({preset} preset)"
                  ).save(folder / "attention.html")
    best = att["best"]
    layer, head = best["layer"], best["index"]
    heat = ascii_heatmap(att["layers"][layer][head], att["chars"])
    print(f"\nattention on {tw.show(att['prompt'])!r}: weight on the future, all heads: sum {att['future_sum']}, "
          f"max {att['future_max']} over {att['future_entries']:,} entries", flush=True)
    print(f"head {best['head']} puts the most weight on the name ({best['on_name']:.2f}); its weights "
          f"(row = query, column = key, shades '{SHADES}' 0.1 apart):\n{heat}", flush=True)
    sheet.tables["4. Attention at the last position of the question (after ':', where the city comes next)"] = \
        report.format_table([("head", "layer.head", ""), ("top3", "top 3 positions (char@index:weight)", ""),
                             ("on_name", "on the name", ".2f"), ("on_self", "on itself", ".2f"),
                             ("max", "max weight", ".2f")], att["heads"]) + (
        f"\n\nPrompt {tw.show(att['prompt'])!r}; the name is positions {att['name_positions'][0]}-"
        f"{att['name_positions'][-1]}. Weight on the future over all heads: sum {att['future_sum']}, max "
        f"{att['future_max']} ({att['future_entries']:,} entries). Lecture: layer-0 heads diffuse (max < 0.2), "
        f"its head 1.0 put ≈0.39 on the name, head 1.1 ≈0.58 on itself (head numbers are arbitrary between "
        f"trainings).")
    sheet.tables[f"4b. Head {best['head']}'s weights (most weight on the name), ASCII"] = f"```\n{heat}\n```"
    matrices = {f"head {i}.{h}" + (" (most on the name)" if (i, h) == (layer, head) else ""): a[h]
                for i, a in enumerate(att["layers"]) for h in range(a.shape[0])}
    sheet.figures["attention.png"] = heatmap_figure(
        matrices, att["chars"], f"attention weights on {tw.show(att['prompt'])!r} ({preset} preset, seed 0); "
        f"lines mark the name", ncols=CONFIG.n_heads, highlight=att["name_positions"])
    sheet.claims.append(report.claim("attention puts exactly zero weight on the future", att["future_sum"] == 0.0,
                                     f"sum {att['future_sum']}, max {att['future_max']} over "
                                     f"{att['future_entries']:,} future entries of {len(matrices)} heads", 0.0))
    sheet.extra.update(attention={k: v for k, v in att.items() if k != "layers"},
                       attention_weights={name: np.asarray(w).tolist() for name, w in matrices.items()}, heatmap=heat)


def sqrt_d(sheet: Sheet, model, tok, person, preset: str) -> None:
    """Demo 5: why scores are divided by √d: random vectors, then the trained model's own scores."""
    from attention_jax.data import tiny_world as tw
    rand = sqrt_d_random(SQRT_D_ROWS[preset], pairs=SQRT_D_PAIRS.get(preset))
    sheet.tables[f"5. Why divide by √d: random q, k ~ N(0, 1), {SQRT_D_ROWS[preset]:,} rows x {SQRT_D_KEYS} keys "
                 f"(seed {SQRT_D_SEED})"] = report.format_table(
        [("d_k", "d_k", "d"), ("std", "std of q·k", ".2f"), ("sqrt_d", "√d_k", ".2f"),
         ("raw_max", "mean max weight, q·k", ".3f"), ("scaled_max", "mean max weight, ÷√d_k", ".3f"),
         ("saturated", "rows > 0.99, q·k", ".1%"), ("scaled_saturated", "rows > 0.99, ÷√d_k", ".1%"),
         ("lecture", "lecture", "")], rand)
    worst = max(rand, key=lambda r: abs(r["std"] / r["sqrt_d"] - 1))
    off = abs(worst["std"] / worst["sqrt_d"] - 1)
    sheet.claims.append(report.claim("random q·k has std ≈ √d_k (within 5% at every d_k)", off < 0.05,
                                     ", ".join(f"{r['d_k']}: {r['std']:.2f}" for r in rand)
                                     + f"; furthest {100 * off:.1f}% at d_k {worst['d_k']}", 0.05 - off))
    text = f"\n{person.name} lives in {person.city}.{REVIEW}"
    real = sqrt_d_trained(model, tok.encode(text))
    sheet.tables["5b. The trained model's own scores (d_h = 16), as trained and without the ÷√d"] = report.format_table(
        [("layer", "layer", "d"), ("std_scaled", "std of scores ÷√d", ".2f"),
         ("std_unscaled", "std without ÷√d", ".2f"), ("entropy", "row entropy (nats)", ".2f"),
         ("entropy_unscaled", "entropy without ÷√d", ".2f"), ("uniform_entropy", "uniform entropy", ".2f"),
         ("max_weight", "mean max weight", ".2f"), ("max_weight_unscaled", "mean max without ÷√d", ".2f"),
         ("saturated_unscaled", "rows > 0.99 without ÷√d", ".1%")], real) + (
        f"\n\nText {tw.show(text)!r} ({len(text)} chars); statistics over the causal entries of all heads. "
        "Uniform entropy: the mean of ln(t + 1) over the rows (the lecture quotes ln((T + 1)/2)). "
        "Without the division the same scores are 4x larger and the rows sharper.")
    sheet.figures["sqrt_d.png"] = sqrt_d_figure(rand, real, f"why scores are divided by √d ({preset} preset)")
    sheet.extra.update(sqrt_d_random=rand, sqrt_d_trained=real)


def ablations(sheet: Sheet, models, tok, world, val: tuple, budget: str, pm) -> list[dict]:
    """Demo 6: positions zeroed, each layer's attention or MLP off, each head off, causal -> bidirectional;
    validation bits per character and fact accuracy on every seed's model."""
    from attention_jax.train.loop import mean_std
    vx, vy = val
    print(f"\nablations on {len(models)} model(s): {len(ablation_list(CONFIG))} each ...", flush=True)
    abl = run_ablations(models, tok, world, vx, vy)
    for r in abl:
        r["bpc_text"] = pm(r["bpc"], r.get("bpc_std", 0.0))
        r["acc_text"] = pm(r["acc"], mean_std(r["acc_seeds"])[1])
    sheet.tables["6. Ablations: validation bits per character and fact-completion accuracy"] = report.format_table(
        [("key", "ablation", ""), ("ablation", "what", ""), ("bpc_text", "val bits/char", ""),
         ("change", "change", "+.3f"), ("acc_text", "fact accuracy", ""), ("lecture_bpc", "lecture bits/char", ".3f"),
         ("lecture_acc", "lecture fact", ".2f")], abl) + (
        f"\n\nValidation: {len(vx)} non-overlapping {CONFIG.context}-char windows of the validation text "
        f"({vy.size:,} characters). Fact accuracy: greedy from '\\n{{name}} lives in', {len(world.people)} people, "
        "right iff the text up to the first '.' is ' {city}.'; one teacher-forced pass under the causal mask "
        "(the same as greedy decoding: checked on the intact model), greedy decoding with its own mask for the "
        "bidirectional row (a teacher-forced pass would show it the answer). "
        "A layer's attention or MLP off = the sub-layer removed (the lecture zeroes its output projection: the "
        "same); a head off = its output zeroed before W_o. Layers and heads count from 0, as the lecture's do.")
    sheet.figures["ablations.png"] = ablation_figure(abl, f"ablations, {budget}")
    sheet.claims += report.claims_across_seeds(ablation_claims, {r["key"]: r for r in abl}, len(models))
    return abl
