"""A screenshot of a run's report as a reader first sees it (headless Chromium), for
the README: `python experiments/screenshot.py RUN [--catalog ROOT] [--width 1280] [--out PNG]`.

Needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver) and
selenium (the test extra).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.store import existing_catalog
from pipelines.report.page import write_report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=1400)
    ap.add_argument("--out", default="docs/images/report.png")
    args = ap.parse_args()
    from selenium import webdriver

    folder = Path(tempfile.mkdtemp(prefix="report-"))
    page = write_report(existing_catalog(args.catalog), [args.run], folder / "report.html")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("google-chrome") or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"):
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    browser = webdriver.Chrome(options=options, service=service)
    try:
        browser.set_window_size(args.width, args.height)
        browser.get(page.as_uri())
        browser.save_screenshot(args.out)
    finally:
        browser.quit()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{args.out}: {args.width} x {args.height} px of the report of {args.run}")


if __name__ == "__main__":
    main()
