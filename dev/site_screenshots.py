#!/usr/bin/env python3
"""Screenshots of a `harness site` in headless Chromium (the DevTools client of tests/python/chromium.py):

    python dev/site_screenshots.py SITE_DIR OUT_DIR [--experiment NAME] [--run ID] [--max-height PX]

writes OUT_DIR/site_index.png (the runs, filtered to --experiment when given), site_experiment.png
(that experiment's page: verdict strip, flips, regressions, the metric plots) and site_run.png
(the run page). Each page must load without console errors; exit 1 naming them otherwise, 2 on bad
arguments, 77 when Chromium cannot start.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from chromium import Chromium, ChromiumUnavailable  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site")
    parser.add_argument("out")
    parser.add_argument("--experiment", help="experiment page to show (default: the one with most runs)")
    parser.add_argument("--run", type=int, help="run page to show (default: the experiment's newest run)")
    parser.add_argument("--max-height", type=int, default=2200, help="cut taller pages here (pixels)")
    parser.add_argument("--width", type=int, default=1280)
    args = parser.parse_args()
    site, out = Path(args.site).resolve(), Path(args.out).resolve()
    if not (site / "index.html").is_file() or not (site / "runs.js").is_file():
        print(f"site_screenshots: {site} is not a harness site (no index.html, runs.js)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    data = json.loads((site / "runs.js").read_text().split("=", 1)[1].rstrip().rstrip(";"))
    experiments = {name: slug for name, slug in data["experiments"]}
    if args.experiment:
        if args.experiment not in experiments:
            print(f"site_screenshots: no experiment {args.experiment!r} in {site} ({', '.join(experiments)})", file=sys.stderr)
            return 2
        experiment = args.experiment
    else:
        counts = {}
        for row in data["rows"]:
            counts[row[1]] = counts.get(row[1], 0) + 1
        experiment = data["experiments"][max(counts, key=counts.get)][0]
    index = [name for name, _ in data["experiments"]].index(experiment)
    run = args.run or next(row[0] for row in data["rows"] if row[1] == index)
    try:
        browser = Chromium.start()
    except ChromiumUnavailable as reason:
        print(f"SKIPPED: {reason}")
        return 77
    failures = []
    with browser:
        page = browser.new_page(args.width, 900)
        shots = [("site_index.png", site / "index.html", "experiment" if args.experiment else None),
                 ("site_experiment.png", site / "experiment" / experiments[experiment] / "index.html", None),
                 ("site_run.png", site / "run" / f"{run}.html", None)]
        for name, path, select in shots:
            page.goto(path.as_uri())
            if select == "experiment":
                page.evaluate(f"""(() => {{ const s = document.getElementById('f-experiment');
                    s.value = '{index}'; s.dispatchEvent(new Event('change')); }})()""")
            if page.errors:
                failures.append(f"{path}: {page.errors}")
            height = min(args.max_height, page.evaluate("document.documentElement.scrollHeight"))
            browser.call("Emulation.setDeviceMetricsOverride",
                         {"width": args.width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                         session=page.session)
            page.screenshot(str(out / name), full_page=False)
            print(f"{out / name}: {path.relative_to(site)} ({args.width}x{height})")
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
