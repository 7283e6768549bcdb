"""harness.runs / trials / metrics over a db with the real schema: the DDL of every step of
db/migrations.cpp, applied in order, then rows as the harness writes them."""

import json
import re
import sqlite3

import pytest

import harness
from conftest import ROOT


def create_db(path):
    source = (ROOT / "db" / "migrations.cpp").read_text()
    steps = re.findall(r'R"sql\((.*?)\)sql"', source, re.S)
    assert steps, "no migration SQL found in db/migrations.cpp"
    connection = sqlite3.connect(path)
    for sql in steps:
        connection.executescript(sql)
    connection.execute("INSERT INTO envs VALUES ('env1', '{\"libtorch\": \"2.11.0\"}', '2026-01-01T00:00:00Z')")
    spec = {"name": "bwd_fusion", "dims": {"anchors": 16}}
    connection.execute("INSERT INTO experiments (id, name, spec, spec_hash, created_at) VALUES (1, 'bwd_fusion', ?, 'h1', 't')",
                       (json.dumps(spec),))
    connection.execute("INSERT INTO experiments (id, name, spec, spec_hash, created_at) VALUES (2, 'anchor_scaling', '{}', 'h2', 't')")
    for run_id, experiment, status, verdict in ((1, 1, "ok", "FUSED"), (2, 2, "failed", "INVALID"), (3, 1, "ok", "FUSED")):
        connection.execute(
            "INSERT INTO runs (id, experiment_id, env_id, device, profile, status, verdict, evidence, args, error, "
            "started_at, finished_at) VALUES (?, ?, 'env1', 'cpu', 'cpu', ?, ?, '{\"rule\": 0}', '[]', '', 's', 'f')",
            (run_id, experiment, status, verdict))
        connection.execute(
            "INSERT INTO trials (id, run_id, variant, point, status, error, stderr_tail, dispatch, duration_s, started_at, "
            "details) VALUES (?, ?, 'fused', '{\"dims.anchors\": 16}', ?, '', '', '[]', 1.5, 's', '{\"argv\": [1]}')",
            (run_id, run_id, "ok" if status == "ok" else "oom"))
    values = [(1, "bwd_ms", 3.0, 0), (1, "bwd_ms", 1.0, 1), (1, "bwd_ms", 2.0, 2), (1, "bwd_peak_bytes", 5e6, -1),
              (3, "bwd_ms", 7.0, -1)]
    for run_id, name, value, repeat in values:
        connection.execute("INSERT INTO metrics (run_id, trial_id, variant, point, name, value, unit, repeat) "
                           "VALUES (?, ?, 'fused', '{}', ?, ?, 'ms', ?)", (run_id, run_id, name, value, repeat))
    connection.commit()
    connection.close()


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "harness.db"
    create_db(path)
    return path


def test_runs(db):
    runs = harness.runs(db)
    assert runs["run"].tolist() == [1, 2, 3]
    assert runs["experiment"].tolist() == ["bwd_fusion", "anchor_scaling", "bwd_fusion"]
    assert runs.loc[0, "spec"] == {"name": "bwd_fusion", "dims": {"anchors": 16}}  # JSON parsed
    assert runs.loc[0, "evidence"] == {"rule": 0}
    assert harness.runs(db, experiment="bwd_fusion")["run"].tolist() == [1, 3]
    assert harness.runs(db, status="failed")["verdict"].tolist() == ["INVALID"]
    assert harness.runs(db, parse_json=False).loc[0, "evidence"] == '{"rule": 0}'


def test_envs(db):
    envs = harness.envs(db)
    assert envs["env_id"].tolist() == ["env1"]
    assert envs.loc[0, "json"] == {"libtorch": "2.11.0"}


def test_trials(db):
    trials = harness.trials(db)
    assert trials["status"].tolist() == ["ok", "oom", "ok"]
    assert trials.loc[0, "point"] == {"dims.anchors": 16}
    assert trials.loc[0, "details"] == {"argv": [1]}
    assert harness.trials(db, run=2)["experiment"].tolist() == ["anchor_scaling"]


def test_metrics_and_their_summary(db):
    metrics = harness.metrics(db, run=1)
    assert len(metrics) == 4 and set(metrics["name"]) == {"bwd_ms", "bwd_peak_bytes"}
    summary = harness.metrics(db, experiment="bwd_fusion", summary=True).set_index(["run", "name"])
    assert summary.loc[(1, "bwd_ms"), "median"] == 2.0
    assert summary.loc[(1, "bwd_ms"), "count"] == 3
    assert summary.loc[(1, "bwd_peak_bytes"), "median"] == 5e6  # measured once: stands for itself
    assert summary.loc[(3, "bwd_ms"), "median"] == 7.0


def test_the_db_is_opened_read_only(db):
    before = db.read_bytes()
    harness.runs(db)
    harness.metrics(db, summary=True)
    assert db.read_bytes() == before


def test_bad_db_arguments(tmp_path, db):
    with pytest.raises(FileNotFoundError, match="no file at"):
        harness.runs(tmp_path / "missing.db")
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(ValueError, match="is not a harness db"):
        harness.runs(other)
    with pytest.raises(TypeError, match="run must be an int run id"):
        harness.trials(db, run="1")
