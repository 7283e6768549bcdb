"""`harness runs|metrics|show --format json|csv|md` read back into pandas: every column of
docs/RUNNING.md ("Exports"), every row, every value equal to what the db holds (harness.runs and
harness.metrics read it independently), error text with commas, quotes and line breaks intact.
Runs on the db tests/site_db.sh writes (HARNESS_SITE_DB), copied, one run's error made awkward.
"""

import io
import json
import os
import sqlite3
import subprocess

import pandas as pd
import pytest

import harness
from conftest import copy_site_db

RUN_COLUMNS = ["id", "experiment", "device", "profile", "status", "verdict", "env_id", "started_at", "finished_at",
               "replay_of", "slurm_job_id", "error"]
METRIC_COLUMNS = ["run", "experiment", "variant", "point", "name", "value", "unit", "repeat"]
AWKWARD = ' leading space, a comma, "quotes" and\na second line\r\nand a third |pipe|'


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = copy_site_db(tmp_path_factory.mktemp("exports"))
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE runs SET error = ? WHERE id = (SELECT min(id) FROM runs)", (AWKWARD,))
    return path


def export(db, *args):
    binary = os.environ.get("HARNESS_BIN")
    if not binary:
        pytest.fail("HARNESS_BIN is not set (CTest sets it to the built binary)")
    # Bytes, decoded here: text mode would turn the CRLF inside a quoted CSV cell into LF.
    done = subprocess.run([binary, *args, "--db", str(db)], capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")
    return done.stdout.decode("utf-8")


def markdown_rows(text):
    """A GFM table back into rows of cells (escaped pipes restored)."""
    rows = []
    for line in text.splitlines():
        cells, cell, i = [], "", 1
        while i < len(line):
            if line[i] == "\\" and i + 1 < len(line) and line[i + 1] == "|":
                cell += "|"
                i += 2
                continue
            if line[i] == "|":
                cells.append(cell.strip())
                cell = ""
            else:
                cell += line[i]
            i += 1
        rows.append(cells)
    assert set(rows[1]) <= {"---", "---:"}
    return rows[0], rows[2:]


def test_runs_round_trip(db):
    expected = harness.runs(db).set_index("run").sort_index()
    csv = pd.read_csv(io.StringIO(export(db, "runs", "--limit", "0", "--format", "csv"), newline=""),
                      keep_default_na=False, dtype=str)
    assert list(csv.columns) == RUN_COLUMNS
    assert len(csv) == len(expected)
    csv = csv.set_index(csv["id"].astype(int)).sort_index()
    for column in ["experiment", "device", "profile", "status", "verdict", "env_id", "started_at", "finished_at", "error"]:
        assert csv[column].tolist() == expected[column].fillna("").tolist(), column
    assert csv["replay_of"].tolist() == ["" if pd.isna(v) else str(int(v)) for v in expected["replay_of"]]
    assert AWKWARD in csv["error"].tolist()

    rows = pd.DataFrame(json.loads(export(db, "runs", "--limit", "0", "--format", "json"))).set_index("id").sort_index()
    assert rows["error"].tolist() == expected["error"].fillna("").tolist()
    assert rows["verdict"].tolist() == expected["verdict"].fillna("").tolist()

    header, cells = markdown_rows(export(db, "runs", "--limit", "0", "--format", "md"))
    assert header == RUN_COLUMNS
    assert sorted(int(row[0]) for row in cells) == expected.index.tolist()
    awkward = [row for row in cells if row[0] == str(expected.index.min())][0]
    assert awkward[-1] == " ".join(AWKWARD.replace("\r\n", "\n").split("\n")).strip()


def test_metrics_round_trip(db):
    expected = harness.metrics(db).sort_values(["run", "variant", "name", "repeat", "value"]).reset_index(drop=True)
    csv = pd.read_csv(io.StringIO(export(db, "metrics", "--format", "csv"), newline=""), keep_default_na=False,
                      dtype={"variant": str, "unit": str})
    assert list(csv.columns) == METRIC_COLUMNS
    csv["point"] = csv["point"].map(json.loads)
    csv = csv.sort_values(["run", "variant", "name", "repeat", "value"]).reset_index(drop=True)
    assert len(csv) == len(expected) > 100
    for column in ["run", "experiment", "variant", "name", "unit", "repeat"]:
        assert csv[column].tolist() == expected[column].tolist(), column
    assert csv["point"].tolist() == expected["point"].tolist()
    # Values exactly: the CSV writes the shortest text that reads back as the same double.
    assert csv["value"].astype(float).tolist() == expected["value"].tolist()

    rows = pd.DataFrame(json.loads(export(db, "metrics", "--format", "json")))
    assert sorted(rows.columns) == sorted(METRIC_COLUMNS)  # JSON objects: the same keys, in name order
    assert rows["value"].sum() == pytest.approx(expected["value"].sum(), rel=1e-15)

    run = int(expected["run"].iloc[0])
    shown = pd.read_csv(io.StringIO(export(db, "show", str(run), "--format", "csv"), newline=""), keep_default_na=False)
    assert list(shown.columns) == METRIC_COLUMNS
    assert len(shown) == (expected["run"] == run).sum()
    header, cells = markdown_rows(export(db, "metrics", "--run", str(run), "--format", "md"))
    assert header == METRIC_COLUMNS
    assert len(cells) == len(shown)
