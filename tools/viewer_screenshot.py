"""The docs' screenshot of the attention viewer, taken from a committed results page.

    python tools/viewer_screenshot.py [docs/results/ladder/attention.html] [docs/img/viewer.png]

Opens the page in Debian's headless Chromium (playwright pointed at /usr/bin/chromium, no
downloaded browser), hovers one query token of the head view, and saves the window.
"""
import pathlib
import shutil
import sys

from playwright.sync_api import sync_playwright


def main() -> None:
    page_file = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/ladder/attention.html").resolve()
    out = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else "docs/img/viewer.png")
    chromium = shutil.which("chromium") or sys.exit("no chromium: apt-get install -y chromium")
    out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        page.goto(page_file.as_uri())
        page.hover(".ajv-queries .ajv-token[data-i='12']")      # where one query looks, heads averaged
        page.screenshot(path=str(out))
        browser.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
