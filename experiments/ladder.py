"""The ablation ladder: from a plain average to a transformer block, one part per row.

    python -m experiments.ladder [--preset smoke|cpu|paper] [--rows a,b] [--steps N] [--seeds N]
                                 [--eval-every N] [--lr X] [--batch-size N] [--schedule S] [--corpus PATH]

Every row is `dataclasses.replace` of the row above (experiments.configs.LADDER); each adds
exactly one part. Printed beside the book's figures, with the chapter's nine orderings
checked per seed.
"""
from __future__ import annotations

import functools

from experiments.harness import report
from experiments.harness.experiment import Experiment, Result
from experiments.harness.rows import corpus_tokenizer
from experiments.configs import LADDER, LADDER_BASE, LADDER_BUDGETS
from experiments.plots import curves

ROWS = LADDER
PRESETS = LADDER_BUDGETS


def _book_claims() -> dict[str, str]:
    """The book's figure for each claim, printed beside ours (on its corpus): the chapter's own
    differences, and the rows' perplexities from experiments.configs."""
    row = {r.name: r for r in ROWS}
    none, residual = row["no_context"].book_val_ppl, row["average_residual"].book_val_ppl
    one, two = row["layer_norm"], row["two_blocks"]
    return {"average": "book ≈4x", "positions": "book 2.14 of 188",
            "residual": f"book {residual:.2f} vs {none:.2f}, {100 * abs(residual - none) / none:.1f}%",
            "head_residual/average_residual": "book ≈14", "head_residual/head_replace": "book ≈9",
            "heads/head_residual": "book ≈3", "layer_norm/feed_forward": "book ≈1.8",
            "two_blocks": f"book train {two.book_train_ppl:.2f} vs {one.book_train_ppl:.2f}, "
                          f"val {two.book_val_ppl:.2f} vs {one.book_val_ppl:.2f}"}


BOOK = _book_claims()


def claims(r: dict, book: bool = False) -> list[dict]:
    """The chapter's orderings on the rows present (`r`: name -> record with val_ppl, train_ppl);
    with `book`, each measured figure names the book's beside it."""
    v = {k: x["val_ppl"] for k, x in r.items()}
    t = {k: x["train_ppl"] for k, x in r.items()}
    out, need = [], lambda *names: all(n in r for n in names)
    said = lambda key: f"; {BOOK[key]}" if book and key in BOOK else ""
    if need("no_context", "average"):
        ratio = v["average"] / v["no_context"]
        out.append(report.claim("the average is >= 2x worse than no context", ratio >= 2,
                                f"{v['average']:.2f} vs {v['no_context']:.2f} ({ratio:.2f}x{said('average')})",
                                ratio - 2))
    if need("no_context", "average", "average_positions"):
        gap, back = v["average"] - v["no_context"], v["average"] - v["average_positions"]
        out.append(report.claim("learned positions recover < 5% of that gap", back < 0.05 * gap,
                                f"{back:.2f} of {gap:.2f} points ({100 * back / gap:.1f}%{said('positions')})",
                                0.05 * gap - back))
    if need("no_context", "average_residual"):
        rel = abs(v["average_residual"] - v["no_context"]) / v["no_context"]
        out.append(report.claim("the residual brings the average within 5% of no context", rel < 0.05,
                                f"{v['average_residual']:.2f} vs {v['no_context']:.2f} "
                                f"({100 * rel:.1f}%{said('residual')})", 0.05 - rel))
    for better, worse, text in [
            ("head_residual", "average_residual", "a learned head beats the uniform average + residual"),
            ("head_residual", "head_replace", "the residual head beats the replacing head"),
            ("heads", "head_residual", "four heads beat one"),
            ("feed_forward", "heads", "+ FFN improves"),
            ("layer_norm", "feed_forward", "+ LayerNorm improves")]:
        if need(better, worse):
            gain = v[worse] - v[better]
            out.append(report.claim(text, v[better] < v[worse], f"{v[better]:.2f} vs {v[worse]:.2f} "
                                    f"({gain:.2f} points{said(f'{better}/{worse}')})", gain))
    if need("layer_norm", "two_blocks"):
        lower_train, higher_val = t["layer_norm"] - t["two_blocks"], v["two_blocks"] - v["layer_norm"]
        out.append(report.claim("two blocks: lower train and higher val perplexity than one",
                                lower_train > 0 and higher_val > 0,
                                f"train {t['two_blocks']:.2f} vs {t['layer_norm']:.2f}, "
                                f"val {v['two_blocks']:.2f} vs {v['layer_norm']:.2f}{said('two_blocks')}",
                                min(lower_train, higher_val)))
    return out


def ladder_figure(records: list[dict], title: str):
    fig, ax = report.figure(size=(9, 4.8))
    xs = range(len(records))
    ax.plot(xs, [r["val_ppl"] for r in records], "o-", label="val (ours)")
    ax.plot(xs, [r["train_ppl"] for r in records], "s--", label="train (ours)")
    book = [(i, r["book_val_ppl"]) for i, r in enumerate(records) if r["book_val_ppl"]]
    ax.plot([i for i, _ in book], [b for _, b in book], "kx", markersize=9, label="val (book)")
    ax.set_xticks(list(xs), [r["name"] for r in records], rotation=35, ha="right")
    ax.set(yscale="log", ylabel="perplexity", xlabel="ladder row (each adds one part to the row above)",
           title=title)
    ax.legend()
    return fig


VIEWED = "layer_norm"        # the row whose attention the viewer shows


def save_viewer(table, record: dict, path, title: str, tokens: int = 48) -> None:
    """The trained row's every head on the first held-out tokens, in attention_jax.analysis.viewer."""
    from attention_jax.analysis import viewer
    from attention_jax.data import load_tokenizer
    model = table.load_model(record)
    model.eval()
    ids = table.splits[1][:tokens]
    tok = load_tokenizer(table.corpus.path)
    viewer.view(model, ids, [tok.decode([int(i)]) for i in ids], title=title).save(path)


def run(ctx) -> Result:
    from experiments.harness.rows import Table   # loads the corpus: after the flags are checked
    table = Table.on_corpus(ctx)
    book = table.book
    records, previous = [], None
    for row in ROWS:
        if row.name not in ctx.rows:
            continue
        r = table.train(row.name, row.config, reopen=row.name == VIEWED,
                        say=lambda r: f"params {r['params']:>9,}  train {r['train']:>16}  val {r['val']:>16}")
        r.update(label=row.label, book_val_ppl=row.book_val_ppl if book else None,
                 book_train_ppl=row.book_train_ppl if book else None, book=row.book_text() if book else None,
                 book_shown=row.book_cell() if book else None,
                 change=None if previous is None else r["val_ppl"] - previous)
        previous = r["val_ppl"]
        records.append(r)
    viewed = next((r for r in records if r["name"] == VIEWED), None)
    if viewed is not None:      # the chapter's one block, its four heads on held-out text: interactive
        save_viewer(table, viewed, ctx.folder / "attention.html", f"ladder: the one-block model ({ctx.preset} preset)")
    columns = [("name", "row", ""), ("params", "params", ",d"), ("train", "train ppl", ""),
               ("val", "val ppl", ""), ("book_shown", "book val ppl", ""), ("change", "change", "+.2f")]
    title = f"ladder, {table.budget()}"
    figures = {"ladder.png": ladder_figure(records, title)}
    if any(len(r["history"]) > 1 for r in records):
        figures["curves.png"] = curves(records, ("val_ppl", "train_ppl"),
                                       ("held-out (val) perplexity", "train perplexity"), title)
    summary = [report.book(f"{r['name']}: val perplexity", r["book"], r["val"]) for r in records if r["book"]]
    summary += [report.book(f"{r['name']}: train perplexity", r["book_train_ppl"], r["train"]) for r in records
                if r["book_train_ppl"]]
    return table.result(records, claims=functools.partial(claims, book=book), book=summary, figures=figures,
                        tables={"ladder": report.format_table(columns, records)}, config={"base": LADDER_BASE.to_dict()})


EXPERIMENT = Experiment("ladder", __doc__, PRESETS, run, rows=[r.name for r in ROWS],
                        tokenizer=corpus_tokenizer)
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
