"""`harness site` in headless Chromium, on a db of real CPU runs: every shipped spec, bwd_fusion under
two envs (a two-toolchain diff) and a bisect over the probe wheels (tests/site_db.sh writes it; CTest
passes it as HARNESS_SITE_DB). Every page loads without console errors, uncaught exceptions or
failed loads; every link resolves (the index's rows built by its script included); each plotted
point is the db's median for its run, variant, point and metric, drawn where the y axis puts that
value; the index's filters select what the db holds; flips and regressions are on the pages; db
text full of markup renders as text and runs nothing.

Exits 77 (CTest: skipped) with the reason when Chromium cannot start.
"""

import json
import math
import os
import sqlite3
import statistics
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from conftest import copy_site_db

HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">, "quoted"\nsecond line'


def harness_binary():
    binary = os.environ.get("HARNESS_BIN")
    if not binary:
        pytest.fail("HARNESS_BIN is not set (CTest sets it to the built binary)")
    return binary


@pytest.fixture(scope="module")
def site_db(tmp_path_factory):
    # One run's and one trial's text made hostile: the db is untrusted input.
    db = copy_site_db(tmp_path_factory.mktemp("site-db"))
    with sqlite3.connect(db) as connection:
        run = connection.execute("SELECT max(id) FROM runs").fetchone()[0]
        connection.execute("UPDATE runs SET error = ? WHERE id = ?", (HOSTILE, run))
        connection.execute("UPDATE trials SET error = ?, stderr_tail = ? WHERE id = (SELECT min(id) FROM trials)",
                           (HOSTILE, HOSTILE))
    return db


@pytest.fixture(scope="module")
def site(site_db, tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "site"
    done = subprocess.run([harness_binary(), "site", "-o", str(out), "--db", str(site_db), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def browser(chromium_browser):
    return chromium_browser


def medians(db):
    """(run, variant, point JSON, metric) -> median, repeats winning over a value measured once."""
    values = {}
    with sqlite3.connect(db) as connection:
        for run, variant, point, name, value, repeat in connection.execute(
                "SELECT run_id, variant, point, name, value, repeat FROM metrics"):
            key = (run, variant, json.dumps(json.loads(point), separators=(",", ":"), sort_keys=True), name)
            values.setdefault(key, ([], []))[0 if repeat >= 0 else 1].append(value)
    return {key: statistics.median(repeats or once) for key, (repeats, once) in values.items()}


def local_file(url):
    parsed = urllib.parse.urlparse(url)
    return Path(urllib.parse.unquote(parsed.path)) if parsed.scheme == "file" else None


def test_every_page_loads_clean_and_every_link_resolves(site, browser):
    page = browser.new_page()
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    broken, errors, checked = [], {}, 0
    for path in pages:
        page.goto(path.as_uri())
        if page.errors:
            errors[str(path.relative_to(site))] = page.errors
        assert page.dialogs == [], f"{path}: the page opened a dialog: {page.dialogs}"
        for href in page.evaluate("Array.from(document.querySelectorAll('a[href]'), a => a.href)"):
            target = local_file(href)
            if target is None:
                continue
            checked += 1
            if not target.exists():
                broken.append(f"{path.relative_to(site)} -> {href}")
    assert errors == {}
    assert broken == []
    assert checked > 100


def test_plotted_points_are_the_db_medians_where_the_axis_puts_them(site, site_db, browser):
    expected = medians(site_db)
    page = browser.new_page()
    compared = 0
    for path in sorted((site / "experiment").rglob("*.html")):
        page.goto(path.as_uri())
        figures = page.evaluate("""Array.from(document.querySelectorAll('figure.plot'), f => {
            const axis = f.querySelector('g.axis-y');
            return {metric: f.dataset.metric,
                    axis: axis ? [axis.dataset.low, axis.dataset.high, axis.dataset.log, axis.dataset.pixelLow,
                                  axis.dataset.pixelHigh].map(Number) : null,
                    points: Array.from(f.querySelectorAll('g.point'), g => {
                      const c = g.querySelector('circle');
                      return [g.dataset.key, Number(g.dataset.y), c ? Number(c.getAttribute('cy')) : null];
                    }).filter(p => p[0])};
        })""")
        for figure in figures:
            low, high, log, pixel_low, pixel_high = figure["axis"]
            for key, y, cy in figure["points"]:
                run, variant, point = key.split("|", 2)
                point = json.dumps(json.loads(point), separators=(",", ":"), sort_keys=True)
                want = expected[(int(run), variant, point, figure["metric"])]
                assert y == pytest.approx(want, rel=1e-12, abs=0.0), (path.name, key, figure["metric"])
                if log:
                    t = (math.log10(y) - math.log10(low)) / (math.log10(high) - math.log10(low))
                else:
                    t = (y - low) / (high - low)
                assert cy == pytest.approx(pixel_low + t * (pixel_high - pixel_low), abs=0.06), (path.name, key)
                compared += 1
    assert compared > 50


def test_index_filters_select_what_the_db_holds(site, site_db, browser):
    with sqlite3.connect(site_db) as connection:
        by_experiment = dict(connection.execute(
            "SELECT e.name, count(*) FROM runs r JOIN experiments e ON e.id = r.experiment_id GROUP BY e.name"))
        total = connection.execute("SELECT count(*) FROM runs").fetchone()[0]
    page = browser.new_page()
    page.goto((site / "index.html").as_uri())
    assert page.errors == []
    assert page.evaluate("document.getElementById('p-info').textContent").startswith(f"{total} of {total} runs")
    for name, count in by_experiment.items():
        shown = page.evaluate(f"""(() => {{
            const select = document.getElementById('f-experiment');
            select.value = String(Array.from(select.options).findIndex(o => o.textContent === {json.dumps(name)}) - 1);
            select.dispatchEvent(new Event('change'));
            return [document.getElementById('p-info').textContent,
                    Array.from(document.querySelectorAll('#runs-body tr td:nth-child(2)'), td => td.textContent)];
        }})()""")
        assert shown[0].startswith(f"{count} of {total} runs"), name
        assert set(shown[1]) == {name}
    # Free text finds the hostile error, shown as text.
    rows = page.evaluate("""(() => {
        document.getElementById('f-experiment').value = '';
        const text = document.getElementById('f-text');
        text.value = 'window.__pwned';
        text.dispatchEvent(new Event('input'));
        return Array.from(document.querySelectorAll('#runs-body tr td:last-child'), td => td.textContent);
    })()""")
    assert rows == [HOSTILE.split("\n")[0]]
    assert page.evaluate("window.__pwned === undefined")


def test_flips_regressions_and_the_bisect_are_on_the_pages(site, browser):
    page = browser.new_page()
    page.goto((site / "experiment" / "bisect_probe" / "index.html").as_uri())
    flipped = page.evaluate("document.querySelectorAll('div.strip a.flip').length")
    assert flipped >= 1  # LEGACY <-> FLIPPED between probes of the bisect
    assert page.evaluate("document.querySelectorAll('figure.plot polygon.band').length") > 0
    rings = page.evaluate("Array.from(document.querySelectorAll('figure.plot g.point title'), t => t.textContent)"
                          ".filter(t => t.includes('called WORSE'))")
    assert any("peak_bytes" in ring for ring in rings)  # 1 MiB -> 2 MiB at the flip, outside the noise
    page.goto((site / "regressions.html").as_uri())
    assert "peak_bytes" in page.evaluate("document.body.innerText")
    page.goto((site / "bisects.html").as_uri())
    bisect = page.evaluate("document.querySelector('table a[href^=\"bisect/\"]').href")
    page.goto(bisect)
    assert page.errors == []
    text = page.evaluate("document.body.innerText")
    assert "1.5" in text and "first bad" in text.lower()
    page.goto((site / "envs.html").as_uri())
    assert page.evaluate("document.querySelectorAll('table.matrix tr').length") > 2  # keys that differ, side by side
    assert "OMP_NUM_THREADS" in page.evaluate("document.body.innerText")


def test_db_text_renders_as_text(site, site_db, browser):
    with sqlite3.connect(site_db) as connection:
        run = connection.execute("SELECT max(id) FROM runs").fetchone()[0]
    page = browser.new_page()
    page.goto((site / "run" / f"{run}.html").as_uri())
    assert page.errors == []
    assert page.dialogs == []
    assert page.evaluate("window.__pwned === undefined")
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert "<script>window.__pwned = 1</script>" in page.evaluate("document.body.innerText")
