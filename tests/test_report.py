"""The results writer's checks: verdicts and tallies, and figures with a blank panel."""

import pytest

from experiments.harness import report


def test_claims_a_budget_cannot_decide_are_neither_pass_nor_fail():
    claims = [report.claim("a", True, "1"), report.claim("b", False, "2"), dict(report.claim("c", True, "3"), decided=False)]
    assert [report.verdict(c) for c in claims] == ["PASS", "FAIL", report.UNDECIDED]
    assert report.tally(claims) == f"1 of 2 claims hold; 1 {report.UNDECIDED}"
    assert "PASS" not in report.markdown("x", "smoke", {}, claims[2:])


def test_a_figure_with_a_blank_panel_is_caught():
    fig, (full, blank, guide) = report.figure(ncols=3)
    full.plot([1, 2], [3, 4])
    blank.set_title("nothing here")
    guide.axvline(1.0)                  # a guide line is not data
    guide.set_title("only a guide")
    guide.bar([0, 1], [0, 0])           # nor are bars of no height
    assert report.empty_axes(fig) == ["nothing here", "only a guide"]
    fig2, ax = report.figure()
    ax.bar([0, 1], [0.5, 0])
    assert report.empty_axes(fig2) == []


def test_results_are_written_readable_by_others_as_the_umask_allows(tmp_path):
    import os
    import stat
    old = os.umask(0o022)
    try:
        report.atomic_write(tmp_path / "results.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "results.json").stat().st_mode) == 0o644


# --- what the lab writes into Markdown runs nothing ---------------------------------------------

HOSTILE = ['<img src=x onerror="window.hostile=1">', "<script>window.hostile=1</script>",
           "[click me](javascript:window.hostile=1)", "![x](https://example.invalid/x.png)",
           "a | pipe\nand a <b>new line</b>", "<https://example.invalid>"]
# What breaks a table's columns rather than running: a pipe escaped by hand, backticks (a code span the
# table splitter reads across cells), a backslash at a cell's end, an entity that would read as `<`.
CELLS = ["a \\| pipe escaped by hand", "`a | b` in backticks", "`unclosed", "closes`", "ends in a backslash \\",
         "&lt;script&gt;window.hostile=1&lt;/script&gt;"]
FILES = ['<img src=x onerror="window.hostile=1">.png', "a](javascript:window.hostile=1).png", "a b (c) `d`.png"]
VIEWS = ['<img src=x onerror="window.hostile=1">.html', "a](javascript:window.hostile=1).html"]


def hostile_pages(folder):
    """Every Markdown writer of the lab, fed hostile strings where outside text goes in: a corpus's file
    name in a title, Winograd words and decoded tokens in cells, a failure's reason, a claim's figure,
    figures' and views' file names, a benchmark's table, a CI record."""
    import json
    from experiments.harness import gather, results_page
    name, strings = "ladder", HOSTILE + CELLS
    rows = [{"word": h, "other": strings[-1 - i], "n": i} for i, h in enumerate(strings)]
    table = report.format_table([("word", "word", ""), ("other", "other", ""), ("n", "n", "d")], rows)
    claims = [report.claim(f"the answer is {h}", i % 2 == 0, h) for i, h in enumerate(strings)]
    tables = {f"trained on {h}": table for h in HOSTILE[:2] + CELLS[:2]}
    backend = {"backend": HOSTILE[1], "device_count": 1, "device_kinds": [CELLS[1]], "jax": "0", "jaxlib": "0",
               "flax": "0", "plugins": {}}
    run = folder / "run" / name
    report.write_results(run, name, rows=rows, claims=claims, tables=tables, preset="cpu",
                         extra={"figures": FILES, "book": [], "backend": backend,
                                "time": {"wall_s": 1.0, "programs": 1, "compile_s": 0.5, "trace_and_lower_s": 0.1}})
    results = json.loads((run / "results.json").read_text())
    (folder / "run" / "norms").mkdir()
    for view in VIEWS:
        (run / view).write_text("")
    docs = folder / "docs"
    docs.mkdir()
    (docs / "table.md").write_text((run / "table.md").read_text())
    (docs / "page.md").write_text(results_page.page(name, results, folder / "run", training=True))
    failed = gather.Run(folder / "run", [name, "norms"], [name, "norms"], {"norms": HOSTILE[0] + " " + HOSTILE[2]})
    (docs / "REPORT.md").write_text(gather.gather(failed, *gather.results(failed)))
    (docs / "performance.md").write_text(results_page.performance_figures({name: results}, {name: ("trained on",)}))
    legs = [{"what": h, "python": "3.11", "command": c, "pytest": h,
             "versions": dict.fromkeys(("jax", "jaxlib", "flax", "numpy", "torch"), c)} for h, c in zip(HOSTILE, CELLS)]
    (docs / "ci.md").write_text(results_page.ci_table(legs))
    return docs


def _rendered(markdown_text: str) -> tuple[list[list[list[str]]], str]:
    """(each table's rows, each row's cell texts; the whole text) of Markdown as the site renders it."""
    import html.parser
    import markdown

    class Reader(html.parser.HTMLParser):
        tables, text, cell = [], [], None

        def handle_starttag(self, tag, attrs):
            if tag == "table":
                self.tables.append([])
            elif tag == "tr":
                self.tables[-1].append([])
            elif tag in ("td", "th"):
                self.cell = []
            elif tag == "img":                  # an image's text is its alt
                self.text.append(dict(attrs).get("alt", ""))

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.tables[-1][-1].append("".join(self.cell).strip())
                self.cell = None

        def handle_data(self, data):
            self.text.append(data)
            if self.cell is not None:
                self.cell.append(data)
    html_text = markdown.markdown(markdown_text, extensions=["tables", "toc", "pymdownx.superfences",
                                                             "pymdownx.highlight"])
    reader = Reader()
    reader.tables, reader.text = [], []
    reader.feed(html_text)
    return reader.tables, " ".join("".join(reader.text).split())


def test_a_hostile_name_or_cell_keeps_its_columns_and_renders_as_text(tmp_path):
    """Every page the lab writes, rendered with the site's Markdown: each table row of the hostile table
    holds its string, its partner's and its number, each in its own column (a pipe escaped by hand or a
    backtick had merged or split them); no table line holds a raw `<`; every string reads as the text
    it is; no element comes from one."""
    import html
    docs = hostile_pages(tmp_path)
    strings = [" ".join(h.split()) for h in HOSTILE + CELLS]
    for page in sorted(docs.glob("*.md")):
        text = page.read_text()
        assert [line for line in text.splitlines() if line.startswith("|") and "<" in line] == [], page.name
        tables, shown = _rendered(text)
        for rows in tables:
            assert len({len(cells) for cells in rows}) == 1, (page.name, rows)
            if [c for c in rows[0]] == ["word", "other", "n"]:           # the hostile table itself
                assert [r for r in rows[1:]] == [[h, strings[-1 - i], str(i)] for i, h in enumerate(strings)], page.name
        raw = html.unescape(shown)
        for h in strings[:3] + CELLS[:-1]:
            assert " ".join(h.split()) in raw or page.name in ("ci.md", "performance.md"), (page.name, h)
    for page in ("page.md", "REPORT.md"):          # file names: shown as they are, linked percent-encoded
        tables, shown = _rendered((docs / page).read_text())
        assert all(f"ladder: {f}" in html.unescape(shown) for f in FILES), page
    assert all(v in html.unescape(_rendered((docs / "page.md").read_text())[1]) for v in VIEWS)


def test_hostile_strings_are_escaped_for_markdown_and_read_back_as_text():
    text = report.safe(HOSTILE[0] + HOSTILE[2] + "\n#")
    assert "<" not in text and "](" not in text and "\n" not in text
    assert report.plain(report.format_table([("w", "w", "")], [{"w": HOSTILE[1]}])).count("<script>") == 1
    assert report.Markdown("[a](b)") == report.safe(report.Markdown("[a](b)"))      # the lab's own links stay


@pytest.mark.slow
def test_every_page_the_lab_writes_runs_no_hostile_string_in_mkdocs_and_chromium(tmp_path):
    """Each page, built by mkdocs with the site's Markdown extensions and opened in Chromium: no script
    ran, no element came from a string, no link to javascript: and nothing fetched from outside."""
    import shutil
    import subprocess
    import sys
    docs = hostile_pages(tmp_path)
    config = tmp_path / "mkdocs.yml"
    config.write_text("site_name: hostile\ndocs_dir: docs\nsite_dir: site\nuse_directory_urls: false\n"
                      "markdown_extensions: [tables, toc, pymdownx.superfences, pymdownx.highlight]\n")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(config)], cwd=tmp_path, check=True,
                   timeout=120, capture_output=True)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium here (.ci/run installs Debian's)")
    sync_api = pytest.importorskip("playwright.sync_api")
    from test_analysis_viewer import ARGS
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        for name in ("table", "page", "REPORT"):
            html = (tmp_path / "site" / f"{name}.html").read_text()
            for raw in ("<img src=x", "<script>window", "<b>", 'href="javascript', 'src="https://example'):
                assert raw not in html, (name, raw)
            page = browser.new_page()
            asked = []
            page.on("request", lambda r: asked.append(r.url))
            page.goto((tmp_path / "site" / f"{name}.html").as_uri())
            page.wait_for_load_state("load")
            assert page.evaluate("window.hostile") is None
            assert page.eval_on_selector_all("img[src='x'], b, a[href^='javascript']", "els => els.length") == 0
            assert "example.invalid" not in " ".join(asked)
            assert HOSTILE[0] in page.inner_text("body")                   # shown as the text it is
            page.close()
        browser.close()
