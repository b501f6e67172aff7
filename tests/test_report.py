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


def hostile_pages(folder):
    """Every Markdown writer of the lab, fed hostile strings where outside text goes in: a corpus's file
    name in a title, Winograd words and decoded tokens in cells, a failure's reason, a claim's figure."""
    import json
    from experiments import all as all_mod, pages
    name = "ladder"
    rows = [{"word": h, "n": i} for i, h in enumerate(HOSTILE)]
    table = report.format_table([("word", "word", ""), ("n", "n", "d")], rows)
    claims = [report.claim(f"the answer is {h}", i % 2 == 0, h) for i, h in enumerate(HOSTILE)]
    tables = {f"trained on {h}": table for h in HOSTILE[:2]}
    run = folder / "run" / name
    report.write_results(run, name, rows=rows, claims=claims, tables=tables, preset="cpu")
    results = json.loads((run / "results.json").read_text())
    docs = folder / "docs"
    docs.mkdir()
    (docs / "table.md").write_text((run / "table.md").read_text())
    (docs / "page.md").write_text(pages.page(name, results))
    (docs / "REPORT.md").write_text(all_mod.gather(folder / "run", [name], {"norms": HOSTILE[0] + " " + HOSTILE[2]}))
    return docs


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
    from test_viewer import ARGS
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
