"""One report of a run of several tables (`experiments.all`), gathered from each table's results.

It says first what did not run (which tables, and why, a line each), then counts the claims of
the tables that ran, and says that it counts only those; then the book's figures beside ours,
every claim, where and how long each ran, and every table with its figures. A run of every
table writes REPORT.md; a run of some (--only, --skip) writes a report named and titled for
the tables it holds, so it never replaces the report of them all.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

from experiments.harness import report

FULL = "REPORT.md"


@dataclasses.dataclass
class Run:
    """What one run of `experiments.all` was asked for and what came of it."""
    out: pathlib.Path
    names: list[str]                      # the tables asked for, in the order they run
    everything: list[str]                 # every table this install has
    failures: dict[str, str] = dataclasses.field(default_factory=dict)   # table -> why it did not run, one line

    def _left_out(self) -> list[str] | None:
        """The tables this run leaves out, when naming them is shorter than naming those it holds."""
        left_out = [n for n in self.everything if n not in self.names]
        return left_out if len(left_out) < len(self.names) else None

    @property
    def file(self) -> pathlib.Path:
        """REPORT.md for every table; else REPORT-<tables>.md, or REPORT-without-<tables>.md when shorter."""
        left_out = self._left_out()
        return self.out / (FULL if left_out == [] else f"REPORT-without-{'-'.join(left_out)}.md" if left_out
                           else f"REPORT-{'-'.join(self.names)}.md")

    @property
    def title(self) -> str:
        left_out = self._left_out()
        return ("every table of the chapter" if left_out == [] else
                f"every table of the chapter but {', '.join(left_out)}" if left_out else ", ".join(self.names))

    def command(self, presets: list[str]) -> str:
        """The command that makes this report again."""
        left_out = self._left_out()
        chosen = "" if left_out == [] else f" --skip {','.join(left_out)}" if left_out else f" --only {','.join(self.names)}"
        return "python -m experiments.all" + (f" --preset {presets[0]}" if len(presets) == 1 else "") + chosen


def results(run: Run) -> tuple[dict[str, dict], dict[str, str]]:
    """(results.json, table.md) of each table that ran now, by name. One whose files cannot be read back
    joins the failures; an earlier run's results of a table that failed now are not this run's: never read."""
    found, texts = {}, {}
    for name in run.names:
        if name in run.failures:
            continue
        try:
            found[name] = json.loads((run.out / name / "results.json").read_text(encoding="utf-8"))
            texts[name] = (run.out / name / "table.md").read_text(encoding="utf-8")
        except (OSError, ValueError) as e:
            found.pop(name, None)
            run.failures[name] = f"its results cannot be read back ({type(e).__name__}: {e}); run it again"
    return found, texts


def held(found: dict[str, dict]) -> str:
    """'27 of 27 claims hold' over the tables that ran (and what was left unchecked, and why)."""
    return report.tally([c for r in found.values() for c in r["claims"]])


def tables(n: int) -> str:
    """'1 table', '14 tables'."""
    return f"{n} table" + ("" if n == 1 else "s")


def headline(run: Run, found: dict[str, dict]) -> list[str]:
    """The report's first lines: what did not run, a line each, before anything that did."""
    if not run.failures:
        return [f"All {tables(len(run.names))} ran: {report.safe(held(found))}.", ""]
    failed = f"({', '.join(run.failures)})"
    said = (f"**None of the {tables(len(run.names))} ran** {failed}, so no claim was checked." if not found else
            f"**{len(run.failures)} of {tables(len(run.names))} did not run** {failed}, so every count below is of "
            f"the {len(found)} that ran: {report.safe(held(found))}.")
    return [said, ""] + [f"- **{name}** did not run: {report.safe(reason)}" for name, reason in run.failures.items()] + [""]


def gather(run: Run, found: dict[str, dict], texts: dict[str, str]) -> str:
    """The report's Markdown: what did not run first, then every figure, claim, time and table of what did."""
    presets = sorted({r.get("preset") for r in found.values() if r.get("preset")})
    md = [f"# attention_jax: {run.title}", ""] + headline(run, found)
    md += [f"Preset(s): {report.safe(', '.join(presets) or '-')}. Regenerate with {report.code(run.command(presets))}.",
           ""]
    if "smoke" in presets:
        md += [f"*{report.SMOKE_NOTE}*", ""]
    book = [dict(experiment=n, **b) for n, r in found.items() for b in r.get("book", [])]
    if book:
        md += ["## The book's figures beside ours", "",
               report.format_table([("experiment", "experiment", ""), ("what", "figure", ""), ("book", "book", ""),
                                    ("ours", "ours", "")], book), ""]
    md += [f"## Claims of the {tables(len(found))} that ran: {report.safe(held(found))}", ""]
    for name, r in found.items():
        md += [f"- **{name}**"] + [f"  - **{report.safe(report.verdict(c))}** {report.claim_text(c, markdown=True)}"
                                   for c in r["claims"]]
    md += where_and_how_long(found)
    for name, r in found.items():
        table = report.escape(texts[name].split("\n", 1)[-1]).replace(f"*{report.SMOKE_NOTE}*", "")   # said once
        md += ["", f"# {name}" + (f" (preset: {report.safe(r['preset'])})" if r.get("preset") else ""), table.strip(), ""]
        md += [report.image(f"{name}: {fig}", f"{name}/{fig}") for fig in r.get("figures", [])]
    return "\n".join(md) + "\n"


def where_and_how_long(found: dict[str, dict]) -> list[str]:
    """What ran them, and how much of each run went into making XLA programs."""
    timed = [dict(experiment=n, wall=r["time"]["wall_s"], programs=r["time"]["programs"],
                  compile=r["time"]["compile_s"] + r["time"]["trace_and_lower_s"]) for n, r in found.items() if "time" in r]
    if not timed:
        return []
    from experiments.harness.platform import describe_backend
    backend = next(r["backend"] for r in found.values() if "backend" in r)
    return ["", "## Where and how long", "", report.code(describe_backend(backend)), "",
            report.format_table([("experiment", "experiment", ""), ("wall", "seconds", ".1f"),
                                 ("programs", "XLA programs made here", "d"),
                                 ("compile", "seconds making them", ".1f")], timed)]


def write(run: Run) -> str:
    """Write the report; return the line a terminal ends on: what did not run first, then what held."""
    found, texts = results(run)
    report.atomic_write(run.file, gather(run, found, texts))
    if not run.failures:
        return f"wrote {run.file}: {len(found)} of {tables(len(run.names))} ran; {held(found)}"
    failed = f"({', '.join(run.failures)})"
    if not found:
        return f"none of the {tables(len(run.names))} ran {failed}; {run.file} says why"
    return (f"{len(run.failures)} of {tables(len(run.names))} did not run {failed}; {run.file} counts the claims "
            f"of the {len(found)} that ran: {held(found)}")
