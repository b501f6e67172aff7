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
from typing import Any, Iterable, Sequence

Column = tuple[str, str, str]   # (row key, header, format spec such as ",d" or ".2f")


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, str):
        return value
    try:
        return format(value, fmt)
    except (TypeError, ValueError):
        return str(value)


def format_table(columns: Sequence[Column], rows: Iterable[dict]) -> str:
    """A Markdown pipe table; numbers right-aligned so it also reads well on a terminal."""
    rows = list(rows)
    cells = [[_cell(r.get(key), fmt) for key, _, fmt in columns] for r in rows]
    headers = [h for _, h, _ in columns]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers)]
    line = lambda items: "| " + " | ".join(s.rjust(w) for s, w in zip(items, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(headers), sep] + [line(c) for c in cells])


def claim(text: str, passed: bool, measured: str) -> dict:
    """One of the chapter's claims as checked here; `measured` says what the code saw."""
    return {"claim": text, "passed": bool(passed), "measured": measured}


def format_claims(claims: Sequence[dict]) -> str:
    lines = [f"  [{'PASS' if c['passed'] else 'FAIL'}] {c['claim']} ({c['measured']})" for c in claims]
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
    if hasattr(x, "tolist"):
        return _jsonable(x.tolist())
    return x


def atomic_write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def results_dir(out: str | os.PathLike, name: str) -> pathlib.Path:
    path = pathlib.Path(out) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_results(out: str | os.PathLike, name: str, *, rows: list[dict], claims: list[dict],
                  tables: dict[str, str], preset: str | None = None, config: Any = None,
                  extra: dict | None = None) -> pathlib.Path:
    """Write `table.md` (every table, then the claims) and `results.json`; return the folder."""
    folder = results_dir(out, name)
    md = [f"# {name}" + (f" (preset: {preset})" if preset else ""), ""]
    for title, table in tables.items():
        md += [f"## {title}", "", table, ""]
    md += ["## Claims", ""] + [f"- **{'PASS' if c['passed'] else 'FAIL'}** {c['claim']} — {c['measured']}"
                               for c in claims]
    atomic_write(folder / "table.md", "\n".join(md) + "\n")
    payload = {"name": name, "preset": preset, "rows": rows, "claims": claims, "config": config}
    payload.update(extra or {})
    atomic_write(folder / "results.json", json.dumps(_jsonable(payload), indent=2) + "\n")
    return folder


def publish(out: str | os.PathLike, name: str, *, claims: list[dict], **results) -> pathlib.Path:
    """How every experiment ends: print the claims, write the results, say where."""
    print("\n" + format_claims(claims))
    folder = write_results(out, name, claims=claims, **results)
    print(f"\nwrote {folder}")
    return folder


def save_figure(fig, path: pathlib.Path) -> pathlib.Path:
    """Save a matplotlib figure as PNG and close it (plots never open a window)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path
