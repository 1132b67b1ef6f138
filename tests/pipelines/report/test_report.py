"""`pipeline report`: the HTML page, its plots, and the explorer in a real browser."""

import json
import re
import shutil
from pathlib import Path

import pytest

from common.errors import UserError
from pipelines.report.page import write_report
from tests.conftest import run_spec, spec_in
from tests.stages.conftest import TINY_GRPO

SOKOBAN = (
    TINY_GRPO.replace("iterations: 2", "iterations: 3")
    .replace("env: bandit,", "env: sokoban,")
    .replace("max_new_tokens: 8", "max_turns: 3, max_new_tokens: 8")
)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    path, catalog = spec_in(folder, SOKOBAN)
    run_spec(path, catalog, ("run.name=one",))
    run_spec(path, catalog, ("run.name=two", "update.optim.lr=3e-3"))
    return catalog, write_report(catalog, ["one", "two"], folder / "out" / "report.html")


def _explorer(page: str) -> list[dict]:
    return json.loads(
        re.search(r'<script id="trajectories" type="application/json">(.*?)</script>', page, re.S).group(1)
    )


def test_the_page_holds_every_plot_and_the_runs(report):
    _, path = report
    page = path.read_text()
    names = ["reward", "success", "in_group_std", "entropy", "grad_norm", "response_length", "diversity"]
    assert sorted(p.stem for p in (path.parent / "report").glob("*.png")) == sorted(names)
    assert page.count('<img class="plot"') == len(names) and "http://" not in page and "https://" not in page
    assert "Run one" in page and "Run two" in page and "lr: 3e-3" in page  # the resolved specs
    trajectories = _explorer(page)
    assert len(trajectories) == 3 * 2 * 2 and all(t["turns"] for t in trajectories)
    assert {t["iteration"] for t in trajectories} == {0, 1, 2}
    from pipelines.report.page import explorer_data

    catalog, _ = report
    assert {t["iteration"] for t in explorer_data(catalog, "one", limit=6)} == {0, 2}  # whole iterations, spaced


def test_an_unknown_run_is_a_one_line_error(report, tmp_path):
    catalog, _ = report
    with pytest.raises(UserError, match=r"report: no run 'three' in catalog .* \(expected one of: one, two\)"):
        write_report(catalog, ["three"], tmp_path / "r.html")


def _browser(profile: Path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip(
            "headless Chromium is not installed (Debian: apt-get install chromium chromium-driver); "
            ".ci/run installs it where it can"
        )
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    # no background networking: this machine's network is closed, and the page needs none
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1400,2400",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def test_the_report_renders_in_chromium_and_the_explorer_steps_through_turns(report):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _, path = report
    browser = _browser(path.parent / "chromium-profile")
    try:
        browser.get(Path(path).as_uri())
        widths = browser.execute_script(
            "return Array.from(document.querySelectorAll('img.plot')).map(i => i.complete ? i.naturalWidth : 0)"
        )
        assert len(widths) == 7 and all(w > 0 for w in widths)
        # pick a trajectory with more than one turn, then step through its turns
        traj = next(t for t in _explorer(path.read_text()) if len(t["turns"]) > 1)
        Select(browser.find_element(By.ID, "pick-iteration")).select_by_value(str(traj["iteration"]))
        Select(browser.find_element(By.ID, "pick-group")).select_by_value(str(traj["group"]))
        Select(browser.find_element(By.ID, "pick-trajectory")).select_by_value(str(traj["sample"]))
        view = browser.find_element(By.ID, "turn-view")
        first = view.text
        assert view.get_attribute("data-turn") == "0" and traj["turns"][0]["state"].split("\n")[0] in first
        browser.find_element(By.ID, "turn-next").click()
        assert view.get_attribute("data-turn") == "1" and view.text != first
        assert browser.find_element(By.ID, "turn-label").text == f"turn 2 / {len(traj['turns'])}"
        browser.find_element(By.ID, "turn-prev").click()
        assert view.get_attribute("data-turn") == "0" and view.text == first
        browser.execute_script("document.getElementById('explorer').scrollIntoView()")
        shot = path.parent / "report-screenshot.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        browser.quit()


def test_the_page_reads_at_a_glance_in_chromium_at_1280_and_390_px(report):
    """The summary comes first; two or more plots to a row on a laptop, one on a phone."""
    _, path = report
    browser = _browser(path.parent / "chromium-profile-layout")
    try:
        for width, per_row in ((1280, 2), (390, 1)):
            browser.set_window_size(width, 1600)
            browser.get(Path(path).as_uri())
            inner = browser.execute_script("return window.innerWidth")
            boxes = browser.execute_script(
                "return Array.from(document.querySelectorAll('img.plot')).map(i => {"
                "const r = i.getBoundingClientRect(); return [r.left, r.top, r.right]; })"
            )
            tops = [round(b[1]) for b in boxes]
            first_row = [b for b in boxes if round(b[1]) == tops[0]]
            assert (len(first_row) >= 2) if per_row == 2 else (len(first_row) == 1), (width, inner, boxes)
            assert all(b[2] <= inner + 1 for b in boxes)  # nothing wider than the window
            summary = browser.execute_script("return document.getElementById('summary').getBoundingClientRect().top")
            assert summary < min(tops)
    finally:
        browser.quit()


def test_the_summary_says_what_ran_how_eval_moved_and_where_time_went(report):
    _, path = report
    page = path.read_text()
    block = page.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
    assert "<b>one</b>: finished, 3 iterations" in block and "<b>two</b>" in block
    assert "wall time" in block and "stage time by node: " in block and "warnings: " in block


def test_axes_do_not_exaggerate():
    from pipelines.report.intervals import wilson
    from pipelines.report.page import y_range

    assert y_range([0.2, 0.25], rate=True) == (-0.02, 1.02)  # rates on [0, 1]
    lo, hi = y_range([2.247, 2.243], rate=False)  # a 0.2% change of entropy stays a flat line
    assert hi - lo >= 0.2 * 2.247
    lo, hi = y_range([0.0, 10.0], rate=False)
    assert lo <= 0.0 and hi >= 10.0 and hi - lo < 12
    low, high = wilson(64, 128)
    assert low == pytest.approx(0.414, abs=1e-3) and high == pytest.approx(0.586, abs=1e-3)


def test_the_summary_states_the_eval_change_with_its_intervals(catalog):
    import pyarrow as pa

    from catalog.datasets import Table
    from catalog.runs import RunLog, RunRecord, StepRecord
    from pipelines.report.summary import summary

    rows = [
        {"policy_version": v, "temperature": t, "success": i < k}
        for v, t, k in ((0, 0.5, 32), (10, 0.5, 96), (0, 0.0, 30), (10, 0.0, 33))
        for i in range(128)
    ]
    catalog.writer("eval-1", {"evals": Table(view="evals")}).commit({"evals": pa.Table.from_pylist(rows)}, {}, {})
    log = RunLog(catalog.root, RunRecord(run="r", spec_file="x.yaml", spec="", iterations=10, seed=0))
    log.add_step(StepRecord("r", 0, "eval", "eval", "eval-1", "ran", 3.0, 0.0))
    log.finish("finished")
    text = summary(catalog, "r", [])
    assert "T=0.5, 128 episodes): v0 25.0% [18.3%, 33.2%] &rarr; v10 <b>75.0%</b>" in text
    assert "<b>rose beyond noise</b>" in text  # T = 0.5
    assert "T=0, 128 episodes): v0 23.4%" in text and "<b>no change beyond noise</b>" in text  # greedy: 30 -> 33
    assert "warnings: none fired" in text


def test_intervals_over_seeds_stay_inside_what_they_measure():
    from pipelines.report.intervals import mean_interval, rate_interval, t95

    # the README's three seeds of the default: a t-interval on the rates ran to [-3.4, 119.8]
    low, high = rate_interval([0.676, 0.770, 0.301], episodes=256)
    assert 0 < low < 0.301 and 0.770 < high < 1 and (round(100 * low, 1), round(100 * high, 1)) == (9.1, 95.4)
    # near a bound it is wider on the far side, and a rate of 1 (or 0) is half an episode inside it
    low, high = rate_interval([1.0, 1.0, 0.953], episodes=64)
    assert 0.8 < low < 0.953 and 0.99 < high < 1 and high - 0.98 < 0.98 - low
    assert rate_interval([0.0, 0.0, 0.0], 64) == (0.0, 0.0) and rate_interval([0.5], 64) is None
    # the mean of differences keeps its sign and stays inside [-1, 1]
    assert mean_interval([0.387, 0.445, 0.070]) == pytest.approx((-0.2003, 0.8017), abs=1e-3)
    assert mean_interval([-0.9, 0.9, -0.9])[0] == -1.0 and mean_interval([0.1]) is None
    assert (t95(2), t95(12), t95(100)) == (4.303, 2.228, 1.96)
