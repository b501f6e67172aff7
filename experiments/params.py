"""Model size is arithmetic: every count by closed-form formula and by the framework.

`python -m experiments.params` splits one block into attention 4d² + 4d, MLP 8d² + 5d and
LayerNorms 4d (12d² + 13d, MLP ≈ 2/3), counts the ladder's models, GPT-2 small (exactly
124,439,808), the lecture's tiny char GPT (109,056) and GPT-3 by 12·L·d² against 175 B.
The framework side always counts abstract shapes (`nnx.eval_shape`): no weights are allocated.
"""
from __future__ import annotations

import dataclasses

from attention_jax.config import GPT2_SMALL, ModelConfig
from experiments.harness import report
from experiments.harness.experiment import Experiment, Result
from experiments.configs import GPT3, LADDER, TINY_GPT

NAME = "params"
# Counting is instant except GPT-3's 96 abstract blocks (~3 s), which smoke skips.
PRESETS = {"smoke": dict(count_gpt3=False), "cpu": dict(count_gpt3=True), "paper": dict(count_gpt3=True)}
# The ladder's counts as the issue lists them; the book itself prints only the W_o (+16,512) and LayerNorm (+768) steps.
EXPECTED_LADDER = {"no_context": 263_168, "average": 263_168, "average_positions": 279_552,
                   "average_residual": 279_552, "head_replace": 328_704, "head_residual": 328_704,
                   "heads": 345_216, "feed_forward": 476_928, "layer_norm": 477_696, "two_blocks": 675_584}


BLOCK_PARTS = ("ln1", "mixer.qkv", "mixer.out", "ln2", "ffn.up", "ffn.down")


def components(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per component, read off the architecture by hand (the framework is not consulted);
    a block's parts (BLOCK_PARTS) are counted once, for one block."""
    d, V, b, f = cfg.d_model, cfg.vocab_size, int(cfg.bias), cfg.d_ff
    width = cfg.heads_used * cfg.d_head_used                       # all heads side by side
    norm = d + d * b                                           # scale, and shift when biased
    ffn = cfg.feed_forward
    return {"token_embed": V * d,
            "position_embed": cfg.max_positions_used * d if cfg.positions == "learned" else 0,
            "ln1": norm if cfg.layer_norm and cfg.mixer != "none" else 0,
            "mixer.qkv": 3 * (d * width + width * int(cfg.qkv_bias)) if cfg.mixer in ("head", "heads") else 0,
            "mixer.out": width * d + d * b if cfg.mixer == "heads" else 0,     # W_o: several heads only
            "ln2": norm if cfg.layer_norm and ffn else 0,
            "ffn.up": d * f + f * b if ffn else 0,
            "ffn.down": f * d + d * b if ffn else 0,
            "ln_f": norm if cfg.layer_norm and cfg.norm == "pre" else 0,
            "lm_head": 0 if cfg.tie_embeddings else d * V + V * b * int(cfg.output_bias)}


def formula(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per top-level part of the model (as `parameters.param_breakdown` groups them), by hand."""
    c = components(cfg)
    return {"token_embed": c["token_embed"], "position_embed": c["position_embed"],
            "blocks": cfg.n_layers * sum(c[k] for k in BLOCK_PARTS), "ln_f": c["ln_f"], "lm_head": c["lm_head"]}


def block_framework(cfg: ModelConfig) -> dict[str, int]:
    """One abstract Block's parameters grouped by sub-layer (mixer, ffn, ln1, ln2)."""
    from flax import nnx
    from attention_jax.parameters import param_breakdown
    from attention_jax.model import Block
    return param_breakdown(nnx.eval_shape(lambda: Block(cfg, rngs=nnx.Rngs(0))))


def block_row(d: int) -> dict:
    """The chapter's block (GPT-2's: every projection biased) at width d, by formula and framework."""
    counted = block_framework(ModelConfig(d_model=d, n_heads=max(1, d // 64), qkv_bias=True))
    attention, mlp, norms = 4 * d * d + 4 * d, 8 * d * d + 5 * d, 4 * d
    return dict(d=d, attention=attention, mlp=mlp, norms=norms, total=12 * d * d + 13 * d,
                framework=sum(counted.values()), mlp_share=mlp / (12 * d * d + 13 * d),
                parts_match=(counted["mixer"], counted["ffn"], counted["ln1"] + counted["ln2"]) == (attention, mlp, norms))


def model_row(name: str, cfg: ModelConfig, book: int | None) -> dict:
    from attention_jax.parameters import count_params
    return dict(model=name, formula=sum(formula(cfg).values()), framework=count_params(cfg), book=book)


def figure(models: list[dict], gpt2_parts: dict[str, int], block768: dict):
    """Where the parameters are: the ladder row by row, and GPT-2 small by part."""
    fig, (ax_l, ax_g) = report.figure(ncols=2, size=(13, 4.6))
    ladder = [r for r in models if r["model"] in {row.name for row in LADDER}]
    ax_l.barh([r["model"] for r in ladder][::-1], [r["framework"] for r in ladder][::-1], color="C0")
    for i, r in enumerate(ladder[::-1]):
        ax_l.text(r["framework"], i, f" {r['framework']:,}", va="center", fontsize=8)
    ax_l.set(xlabel="parameters", title="the ladder: what each part costs", xlim=(0, 1.3 * max(r["framework"]
                                                                                              for r in ladder)))
    layers = GPT2_SMALL.n_layers
    parts = {"token table": gpt2_parts["token_embed"], "positions": gpt2_parts["position_embed"],
             f"attention ×{layers}": layers * block768["attention"], f"MLP ×{layers}": layers * block768["mlp"],
             f"LayerNorms ×{layers} + final": layers * block768["norms"] + gpt2_parts["ln_f"]}
    total, left = sum(parts.values()), 0
    for i, (name, count) in enumerate(parts.items()):
        ax_g.barh([0], [count], left=left, color=f"C{i}", label=f"{name}: {count:,} ({100 * count / total:.3g}%)")
        left += count
    ax_g.set(yticks=[], xlabel="parameters", title=f"GPT-2 small, {total:,} parameters", ylim=(-0.6, 1.6))
    ax_g.legend(fontsize=8, loc="upper left", ncols=2)
    from matplotlib.ticker import EngFormatter
    for ax in (ax_l, ax_g):
        ax.xaxis.set_major_formatter(EngFormatter())     # 200 k, 100 M: no "1e8" in a corner
    return fig


def run(ctx) -> Result:
    from attention_jax.parameters import count_params
    blocks = [block_row(d) for d in (128, 768)]
    models = model_rows(ctx.settings["count_gpt3"])
    ours, gpt2 = gpt2_rows()
    gpt2_total = count_params(GPT2_SMALL)
    table_share = ours["token_embed"] / gpt2_total
    core, embeddings, gpt3 = gpt3_rows()
    print(f"GPT-2 small: the token table holds {table_share:.1%} of the parameters")
    book = [report.book(f"parameters: {r['model']}", r["book"], r["framework"], ",d") for r in models if r["book"]]
    book += [report.book("GPT-3 by 12·L·d² (+ embeddings)", "175 B (reported)", f"{(core + embeddings) / 1e9:.1f} B")]
    claims = check(blocks, models, gpt2, gpt2_total, table_share, core, embeddings)
    return Result(rows=models, claims=claims, book=book,
                  config={**ctx.settings, "ladder": {r.name: r.config.to_dict() for r in LADDER},
                          "tiny_gpt": TINY_GPT.to_dict(), "gpt2_small": GPT2_SMALL.to_dict(),
                          "gpt3": dataclasses.asdict(gpt3_config())},
                  tables=tables(blocks, models, gpt2, gpt3), figures={"params.png": figure(models, ours, blocks[1])},
                  extra={"blocks": blocks, "gpt2_small": gpt2, "gpt3": gpt3, "gpt2_token_table_share": table_share})


def gpt3_config() -> ModelConfig:
    g = GPT3
    return ModelConfig(vocab_size=g["vocab_size"], context=g["context"], d_model=g["d_model"],
                       n_layers=g["n_layers"], n_heads=96, tie_embeddings=True, qkv_bias=True)


def model_rows(count_gpt3: bool) -> list[dict]:
    """The ladder's models, GPT-2 small and the lecture's tiny GPT (and GPT-3 in full), by formula and framework."""
    models = [model_row(r.name, r.config, EXPECTED_LADDER.get(r.name)) for r in LADDER]
    models += [model_row("GPT-2 small", GPT2_SMALL, 124_439_808), model_row("tiny char GPT (lecture)", TINY_GPT, 109_056)]
    if count_gpt3:
        models.append(model_row("GPT-3 (exact, abstract)", gpt3_config(), None))
    return models


def gpt2_rows() -> tuple[dict[str, int], list[dict]]:
    """GPT-2 small by formula (per part) and its rows beside the framework's and the book's."""
    from attention_jax.parameters import param_breakdown
    ours, counted = formula(GPT2_SMALL), param_breakdown(GPT2_SMALL)
    gpt2 = [dict(part=part, formula=ours[part], framework=counted.get(part, 0), book=expected) for part, expected in
            (("token_embed", 38_597_376), ("position_embed", 786_432), ("blocks", 85_054_464), ("ln_f", 1_536))]
    gpt2.insert(3, dict(part="one block", formula=ours["blocks"] // 12, framework=counted["blocks"] // 12, book=7_087_872))
    return ours, gpt2


def gpt3_rows() -> tuple[int, int, list[dict]]:
    """(12·L·d², the embeddings (V + T)·d, the rows beside GPT-3's reported count)."""
    g = GPT3
    core = 12 * g["n_layers"] * g["d_model"] ** 2                 # the 12·L·d² rule
    embeddings = (g["vocab_size"] + g["context"]) * g["d_model"]
    return core, embeddings, [dict(part="12·L·d²", count=core), dict(part="+ (V + T)·d embeddings", count=core + embeddings),
                              dict(part="reported", count=int(g["reported"]))]


def tables(blocks: list[dict], models: list[dict], gpt2: list[dict], gpt3: list[dict]) -> dict[str, str]:
    return {"One block": report.format_table([("d", "d", "d"), ("attention", "attention 4d²+4d", ",d"),
                                              ("mlp", "MLP 8d²+5d", ",d"), ("norms", "LayerNorms 4d", ",d"),
                                              ("total", "12d²+13d", ",d"), ("framework", "framework", ",d"),
                                              ("mlp_share", "MLP share", ".1%")], blocks),
            "Models": report.format_table([("model", "model", "s"), ("formula", "formula", ",d"),
                                           ("framework", "count_params", ",d"), ("book", "book / issue", ",d")], models),
            "GPT-2 small": report.format_table([("part", "GPT-2 small", "s"), ("formula", "formula", ",d"),
                                                ("framework", "param_breakdown", ",d"), ("book", "book", ",d")], gpt2),
            "GPT-3": report.format_table([("part", "GPT-3 (L = 96, d = 12,288)", "s"), ("count", "parameters", ",d")],
                                         gpt3)}


def check(blocks: list[dict], models: list[dict], gpt2: list[dict], gpt2_total: int, table_share: float,
          core: int, embeddings: int) -> list[dict]:
    """Every count by formula against the framework's, and the chapter's statements about them."""
    ladder = {r["model"]: r["framework"] for r in models}
    no_qkv_bias = block_framework(ModelConfig(d_model=768, n_heads=12))
    claims = [report.claim(f"{r['model']}: formula equals the framework count", r["formula"] == r["framework"]
                           and r["book"] in (None, r["framework"]),
                           f"{r['formula']:,} vs {r['framework']:,}" + (f" (listed {r['book']:,})" if r["book"] else ""))
              for r in models]
    return claims + [
        report.claim("one block is 12d² + 13d, split 4d²+4d / 8d²+5d / 4d, MLP ≈ 2/3",
                     all(b["total"] == b["framework"] and b["parts_match"] and abs(b["mlp_share"] - 2 / 3) < 0.01
                         for b in blocks), ", ".join(f"d={b['d']}: {b['framework']:,}, MLP {b['mlp_share']:.1%}"
                                                     for b in blocks)),
        report.claim("GPT-2 small is exactly 124,439,808, every part as the book lists it",
                     gpt2_total == 124_439_808 and all(r["formula"] == r["framework"] == r["book"] for r in gpt2),
                     f"{gpt2_total:,}"),
        report.claim("the token table is nearly a third of GPT-2 small", 0.30 < table_share < 1 / 3, f"{table_share:.1%}"),
        report.claim("dropping the q, k, v biases saves 2,304 per block at d = 768",
                     blocks[1]["framework"] - sum(no_qkv_bias.values()) == 2_304,
                     f"{blocks[1]['framework'] - sum(no_qkv_bias.values()):,}"),
        report.claim("W_o adds 16,512 and LayerNorm 768 to the ladder",
                     (ladder["heads"] - ladder["head_residual"], ladder["layer_norm"] - ladder["feed_forward"])
                     == (16_512, 768), f"+{ladder['heads'] - ladder['head_residual']:,}, "
                                       f"+{ladder['layer_norm'] - ladder['feed_forward']:,}"),
        report.claim("12·L·d² plus embeddings lands within 1% of GPT-3's reported 175 B",
                     abs((core + embeddings) / GPT3["reported"] - 1) < 0.01,
                     f"{core / 1e9:.1f} B + {embeddings / 1e9:.2f} B = {(core + embeddings) / 1e9:.1f} B"),
    ]


EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run, smoke_decides=True)   # exact claims: decided at any budget
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
