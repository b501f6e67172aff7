"""The one results writer every experiment uses.

An experiment produces rows (dicts of numbers), a Markdown table made from them, and a
list of claims from the chapter, each checked by code: `{claim, passed, measured}`.
Everything lands in `<out>/<name>/`: `table.md`, `results.json`, and any PNG plots.
Files are written to a temporary name and renamed, so an interrupted write never
leaves a half file behind.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import re
from typing import Any, Iterable, Sequence

Column = tuple[str, str, str]   # (row key, header, format spec such as ",d" or ".2f")
# Atop a smoke run's table (and printed when the smoke preset is chosen): its figures are plumbing only.
SMOKE_NOTE = ("smoke preset: a plumbing check (every part runs and writes its files), so its "
              "figures mean nothing: each model trains a handful of steps, too few to learn, and an "
              "untrained model's figures can look broken (a perplexity near its vocabulary's size, "
              "an accuracy below chance: its top word is rarely either noun); the claims they "
              "decide are not checked at this budget (--preset cpu or paper for the chapter's)")


class Markdown(str):
    """Text written as Markdown on purpose (a link of the lab's own): `format_table` leaves it as it is."""


def safe(text) -> str:
    r"""Any text from outside (a file name, an error, a word, a decoded token, a table cell) as Markdown
    shows it, running none of it, on one line: no HTML (`<` as an entity: no tag, no autolink), no
    character reference of its own (`&lt;` stays those four characters), no link or image (`](`
    broken), no code span and no backslash escape (backticks and backslashes as entities, so `\|` or
    a stray backtick cannot end a table cell early). The one function every page's outside text goes
    through; the site's Markdown (mkdocs.yml) has no extension that reads attributes or bare addresses."""
    if isinstance(text, Markdown):
        return text
    text = re.sub(r"[\r\n\u2028\u2029]+", " ", str(text))
    for raw, written in _TEXT:
        text = re.sub(raw, written, text)
    return escape(text)


# What `safe` writes as entities before `escape`: `&` where it would start a character reference, then
# backslashes and backticks (the entities' own `&` stays).
_TEXT = ((r"&(?=#?\w+;)", "&amp;"), (r"\\", "&#92;"), ("`", "&#96;"))
# What `escape` rewrites so that Markdown runs none of it: `<` (a tag, an autolink) and `](` (a link, an image).
_ESCAPES = (("<", "&lt;"), ("](", "]\\("))


def escape(markdown: str) -> str:
    """Markdown (a table, its lines kept) with what could run written as text: see `safe`."""
    for raw, written in _ESCAPES:
        markdown = markdown.replace(raw, written)
    return markdown


def plain(markdown: str) -> str:
    """A table `format_table` made safe, as a terminal shows it: what `safe` escaped, back as it was."""
    for raw, written in _ESCAPES:
        markdown = markdown.replace(written, raw)
    for raw, written in (("\\", "&#92;"), ("`", "&#96;"), ("&", "&amp;")):
        markdown = markdown.replace(written, raw)
    return markdown


def code(text) -> Markdown:
    """Text as a code span (a command, a backend's description), or as `safe` text where a code span
    could not hold it as it is (a backtick, `<`, a backslash or `|` in it)."""
    text = " ".join(str(text).split())
    return Markdown(safe(text) if re.search(r"[`<\\|]", text) else f"`{text}`")


def link(text, target: str) -> Markdown:
    """A link of the lab's own to `target` (a file beside the page), its text and address from outside:
    the text `safe` with its brackets escaped, the address percent-encoded."""
    from urllib.parse import quote
    shown = safe(text).replace("[", "\\[").replace("]", "\\]")
    return Markdown(f"[{shown}]({quote(str(target))})")


def image(alt, target: str) -> Markdown:
    """An image (a figure beside the page): `link`'s escaping, shown inline."""
    return Markdown("!" + link(alt, target))


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, str):
        return safe(value)
    try:
        return safe(format(value, fmt))
    except (TypeError, ValueError):
        return safe(value)


def format_table(columns: Sequence[Column], rows: Iterable[dict]) -> str:
    """A Markdown pipe table; numbers right-aligned so it also reads well on a terminal."""
    rows = list(rows)
    pipes = lambda text: text.replace("|", "\\|")           # a "|" inside a cell would split it
    cells = [[pipes(_cell(r.get(key), fmt)) for key, _, fmt in columns] for r in rows]
    headers = [pipes(safe(h)) for _, h, _ in columns]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers)]
    line = lambda items: "| " + " | ".join(s.rjust(w) for s, w in zip(items, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(headers), sep] + [line(c) for c in cells])


def claim(text: str, passed: bool, measured: str, margin: float | None = None) -> dict:
    """One of the chapter's claims as checked here; `measured` says what the code saw.

    `margin`: how far the figure is from failing, in the claim's own units (positive when it
    passes), so a pass by less than the seed-to-seed spread can be seen for what it is.
    """
    out = {"claim": text, "passed": bool(passed), "measured": measured}
    if margin is not None:
        out["margin"] = float(margin)
    return out


def book(what: str, book_figure, ours, fmt: str = ".2f") -> dict:
    """One line of the summary "the book's figure beside ours" (experiments.all puts them in REPORT.md)."""
    show = lambda v: v if isinstance(v, str) else format(v, fmt)
    return {"what": what, "book": show(book_figure), "ours": show(ours)}


def seed_view(record: dict, i: int) -> dict:
    """Seed i's figures in place of the means: every `k` with a per-seed `k_seeds` list (or dict of lists)."""
    view = dict(record)
    for key, value in record.items():
        if key.endswith("_seeds") and key[:-6] in record:
            if isinstance(value, dict):
                view[key[:-6]] = {k: v[i] for k, v in value.items()}
            elif isinstance(value, list):
                view[key[:-6]] = value[i]
    return view


def claims_across_seeds(check, records: dict[str, dict], n_seeds: int) -> list[dict]:
    """`check(records)` on the seed means, each claim annotated with how many seeds it holds in.

    The same check runs on every seed's own figures; a claim then reads "holds in 2 of 3
    seeds" with the smallest margin among them, and results.json keeps every seed's verdict.
    """
    claims = check(records)
    if n_seeds < 2:
        return claims
    per_seed = [check({k: seed_view(r, i) for k, r in records.items()}) for i in range(n_seeds)]
    for j, c in enumerate(claims):
        verdicts = [seed[j] for seed in per_seed]
        margins = [v.get("margin") for v in verdicts]
        c["seeds"] = {"held": sum(v["passed"] for v in verdicts), "of": n_seeds,
                      "passed": [v["passed"] for v in verdicts], "measured": [v["measured"] for v in verdicts],
                      "margins": margins,
                      "smallest_margin": min(margins) if all(m is not None for m in margins) else None}
    return claims


def held_across(verdicts: Sequence[dict]) -> tuple[int, int, float | None]:
    """(held, of, least margin) of one claim's verdicts (one per word pool, or a single one); a verdict
    checked on several seeds counts each seed."""
    held = sum(v["seeds"]["held"] if "seeds" in v else int(v["passed"]) for v in verdicts)
    of = sum(v["seeds"]["of"] if "seeds" in v else 1 for v in verdicts)
    margins = [m for v in verdicts
               if (m := v["seeds"].get("smallest_margin") if "seeds" in v else v.get("margin")) is not None]
    return held, of, min(margins) if margins else None


UNDECIDED = "not checked at this budget"


def unchecked(c: dict, why: str) -> dict:
    """A claim this run could not check, and why (an oracle not installed): neither PASS nor FAIL."""
    return {**c, "decided": False, "why": why}


def verdict(c: dict) -> str:
    """PASS, FAIL, or for a claim the run could not decide, that it was not checked: at its budget (the
    smoke preset), or for the reason it carries (`unchecked`)."""
    if not c.get("decided", True):
        return f"not checked: {c['why']}" if c.get("why") else UNDECIDED
    return "PASS" if c["passed"] else "FAIL"


def tally(claims: Sequence[dict]) -> str:
    """'7 of 9 claims hold', counting decided claims only, and how many were left unchecked and why."""
    decided = [c for c in claims if c.get("decided", True)]
    text = f"{sum(c['passed'] for c in decided)} of {len(decided)} claims hold"
    budget = sum(1 for c in claims if not c.get("decided", True) and not c.get("why"))
    whys = sorted({c["why"] for c in claims if not c.get("decided", True) and c.get("why")})
    text += f"; {budget} {UNDECIDED}" if budget else ""
    for why in whys:
        text += f"; {sum(1 for c in claims if c.get('why') == why and not c.get('decided', True))} not checked ({why})"
    return text


def claim_text(c: dict, markdown: bool = False) -> str:
    """A claim with its measured figure (and its seeds): as plain text for a terminal, or `markdown` safe."""
    show = safe if markdown else str
    text = f"{show(c['claim'])} ({show(c['measured'])}"
    seeds = c.get("seeds")
    if seeds:
        text += f"; holds in {seeds['held']} of {seeds['of']} seeds"
        if seeds.get("smallest_margin") is not None:
            text += f", smallest margin {seeds['smallest_margin']:.3g}"
    return text + ")"


def format_claims(claims: Sequence[dict]) -> str:
    lines = [f"  [{verdict(c)}] {claim_text(c)}" for c in claims]
    return "claims:\n" + "\n".join(lines) if lines else "claims: none"


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, pathlib.PurePath):
        return str(x)
    if hasattr(x, "tolist"):
        return _jsonable(x.tolist())
    return x


def atomic_write(path: pathlib.Path, text: str) -> None:
    """Write to a temporary file of this process's own beside `path`, then rename it over `path`.

    The temporary name is unique (two runs finishing together never share one), and the
    rename is atomic: a reader sees the old file or the new one, never half of one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    from attention_jax.data.corpus import new_file
    fd, tmp = new_file(path.parent, f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def markdown(name: str, preset: str | None, tables: dict[str, str], claims: Sequence[dict]) -> str:
    """Every table, then the claims, as one Markdown document."""
    md = [f"# {name}" + (f" (preset: {preset})" if preset else ""), ""]
    if preset == "smoke":
        md += [f"*{SMOKE_NOTE}*", ""]
    for title, table in tables.items():
        md += [f"## {safe(title)}", "", table, ""]
    md += ["## Claims", ""] + [f"- **{safe(verdict(c))}** {claim_text(c, markdown=True)}" for c in claims]
    return "\n".join(md) + "\n"


def write_results(folder: pathlib.Path, name: str, *, rows: list[dict], claims: list[dict],
                  tables: dict[str, str], preset: str | None = None, config: Any = None,
                  extra: dict | None = None) -> pathlib.Path:
    """Write `table.md` (every table, then the claims) and `results.json` into `folder`."""
    atomic_write(folder / "table.md", markdown(name, preset, tables, claims))
    payload = {"name": name, "preset": preset, "rows": rows, "claims": claims, "tables": tables, "config": config}
    payload.update(extra or {})
    atomic_write(folder / "results.json", json.dumps(_jsonable(payload), indent=2) + "\n")
    return folder


def publish(folder: pathlib.Path, result, *, show: bool = True) -> pathlib.Path:
    """How every experiment ends: print the tables and claims (unless a notebook shows the Result
    itself), write the results and figures, say where."""
    if show:
        for title, table in result.tables.items():
            print(f"\n{title}\n{plain(table)}")
        print("\n" + format_claims(result.claims))
        if result.preset == "smoke":
            print(SMOKE_NOTE)
    write_results(folder, result.name, rows=result.rows, claims=result.claims, tables=result.tables,
                  preset=result.preset, config=result.config,
                  extra={**result.extra, "figures": sorted(result.figures), "book": result.book})
    for file_name, fig in result.figures.items():
        plain_log_ticks(fig)
        if result.preset == "smoke":    # a plumbing check's figure must not pass for the chapter's
            fig.text(0.5, 0.5, "smoke preset: plumbing only", ha="center", va="center", rotation=20,
                     fontsize=28, color="tab:red", alpha=0.25)
        save_figure(fig, folder / file_name)
    if "time" in result.extra:   # what went into making XLA programs, against the run's wall time
        from experiments.harness.compile_clock import describe
        print(f"\n{describe(result.extra['time'])}; the whole run took {result.extra['time']['wall_s']:.1f} s")
    print(f"\n{wrote(folder)}")
    return folder


def wrote(folder: pathlib.Path) -> str:
    """What a run left in its folder, in one line: each page, table and figure by name, and the size of
    it all with the row cache and checkpoints (kept so that a rerun resumes rather than retrains)."""
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    kept = [d.name + "/" for d in sorted(folder.iterdir()) if d.is_dir()]
    size = f"{total / 2**20:.1f} MB" if total >= 2**20 else f"{total / 2**10:.0f} KB"
    return (f"wrote {folder}: {', '.join(files)}; {size} in all" +
            (f", with {' and '.join(kept)} (the row cache and checkpoints a rerun resumes from)" if kept else ""))


def figure(*, ncols: int = 1, size: tuple[float, float] = (6.5, 4.5), **kw):
    """A matplotlib Figure and its axes, made without pyplot: no backend is chosen or switched."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(1, ncols, **kw)
    return fig, axes


def empty_axes(fig) -> list[str]:
    """The panels of a figure that show nothing, by title: no data line with a finite point (an
    axvline is a guide, not data), no bar with a height, no image or filled area."""
    import numpy as np
    empty = []
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            continue
        lines = [l for l in ax.get_lines() if l.get_transform() == ax.transData
                 and np.isfinite(np.asarray(l.get_ydata(), float)).any()]
        bars = [p for p in ax.patches if getattr(p, "get_height", lambda: 0)() and getattr(p, "get_width", lambda: 0)()]
        if not (lines or bars or ax.images or ax.collections):
            empty.append(ax.get_title() or "(untitled)")
    return empty


def plain_log_ticks(fig) -> None:
    """Log axes labelled 30, 40, 60 where matplotlib writes 3×10^1: the same ticks, plain numbers."""
    from matplotlib.ticker import Formatter

    class Plain(Formatter):
        def __init__(self, inner):
            self.inner = inner

        def set_axis(self, axis):
            super().set_axis(axis)
            self.inner.set_axis(axis)

        def set_locs(self, locs):
            self.inner.set_locs(locs)

        def __call__(self, x, pos=None):
            return f"{x:g}" if self.inner(x, pos) else ""      # label where matplotlib would, plainly

    for ax in fig.axes:
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log" and not isinstance(axis.get_major_formatter(), Plain):
                axis.set_major_formatter(Plain(axis.get_major_formatter()))
                axis.set_minor_formatter(Plain(axis.get_minor_formatter()))


def save_figure(fig, path: pathlib.Path) -> pathlib.Path:
    """Save a matplotlib figure as PNG (plots never open a window)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
    return path
