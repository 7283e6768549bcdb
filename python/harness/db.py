"""A harness db as pandas DataFrames (the tables are described in db/README.md).

The db is opened read-only (SQLite URI mode=ro), so a notebook can read a db that a run is still
writing (WAL mode) and can never change it.

    runs = harness.runs("harness.db")                  # one row per run, with the experiment name
    trials = harness.trials("harness.db", run=3)       # one row per trial
    metrics = harness.metrics("harness.db", experiment="bwd_fusion")
"""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing

_JSON_COLUMNS = {"runs": ("spec", "evidence", "args"), "trials": ("details", "point"), "metrics": ("point",)}

_RUNS_SQL = """
SELECT r.id AS run, e.name AS experiment, r.device, r.profile, r.status, r.verdict, r.error,
       r.started_at, r.finished_at, r.env_id, r.replay_of, r.evidence, r.args, e.spec, e.spec_hash
FROM runs r JOIN experiments e ON e.id = r.experiment_id"""

_TRIALS_SQL = """
SELECT t.id AS trial, t.run_id AS run, e.name AS experiment, t.variant, t.point, t.status, t.exit_code,
       t.signal, t.error, t.requested_bytes, t.dispatch, t.duration_s, t.started_at, t.details, t.stderr_tail
FROM trials t JOIN runs r ON r.id = t.run_id JOIN experiments e ON e.id = r.experiment_id"""

_METRICS_SQL = """
SELECT m.run_id AS run, e.name AS experiment, m.trial_id AS trial, m.variant, m.point, m.name, m.value,
       m.unit, m.repeat
FROM metrics m JOIN runs r ON r.id = m.run_id JOIN experiments e ON e.id = r.experiment_id"""


def _connect(db) -> sqlite3.Connection:
    path = os.fspath(db)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"harness db: no file at {path!r} (db: pass the path of a harness.db)")
    connection = sqlite3.connect(f"file:{_uri_path(path)}?mode=ro", uri=True)
    try:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as error:
        connection.close()
        raise ValueError(f"harness db: {path!r} is not an SQLite db ({error})") from None
    missing = {"runs", "experiments", "trials", "metrics"} - tables
    if missing:
        connection.close()
        raise ValueError(f"harness db: {path!r} is not a harness db (no table {', '.join(sorted(missing))})")
    return connection


def _uri_path(path: str) -> str:
    # A file: URI treats '?' and '#' specially; percent-encode them (and '%').
    return os.path.abspath(path).replace("%", "%25").replace("?", "%3f").replace("#", "%23")


def _pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError("harness.runs/trials/metrics/envs need pandas: pip install pandas "
                          "(or pip install harness[db])") from None
    return pandas


def _query(db, sql: str, table: str, where: list, params: list, order: str, parse_json: bool):
    pd = _pandas()

    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY {order}"
    with closing(_connect(db)) as connection:
        frame = pd.read_sql_query(sql, connection, params=params)
    if parse_json:
        for column in _JSON_COLUMNS[table]:
            if column in frame:
                frame[column] = frame[column].map(lambda text: json.loads(text) if isinstance(text, str) and text else text)
    return frame


def _filters(run, experiment, run_column="r.id"):
    where, params = [], []
    if run is not None:
        if isinstance(run, bool) or not isinstance(run, int):
            raise TypeError(f"run must be an int run id (got {type(run).__name__})")
        where.append(f"{run_column} = ?")
        params.append(run)
    if experiment is not None:
        if not isinstance(experiment, str):
            raise TypeError(f"experiment must be a name (got {type(experiment).__name__})")
        where.append("e.name = ?")
        params.append(experiment)
    return where, params


def envs(db="harness.db", *, parse_json=True):
    """One row per toolchain fingerprint: env_id, json (the fingerprint, parsed unless
    parse_json=False), created_at."""
    pd = _pandas()

    with closing(_connect(db)) as connection:
        frame = pd.read_sql_query("SELECT id AS env_id, json, created_at FROM envs ORDER BY created_at, id", connection)
    if parse_json:
        frame["json"] = frame["json"].map(json.loads)
    return frame


def runs(db="harness.db", *, experiment=None, status=None, parse_json=True):
    """One row per run: run, experiment, device, profile, status, verdict, error, started_at,
    finished_at, env_id, replay_of, evidence, args, spec, spec_hash (JSON columns parsed unless
    parse_json=False). Filters: experiment name, status ("ok", "failed", ...)."""
    where, params = _filters(None, experiment)
    if status is not None:
        where.append("r.status = ?")
        params.append(status)
    return _query(db, _RUNS_SQL, "runs", where, params, "r.id", parse_json)


def trials(db="harness.db", *, run=None, experiment=None, parse_json=True):
    """One row per trial: trial, run, experiment, variant, point, status, exit_code, signal, error,
    requested_bytes, dispatch, duration_s, started_at, details, stderr_tail."""
    where, params = _filters(run, experiment, "t.run_id")
    return _query(db, _TRIALS_SQL, "trials", where, params, "t.id", parse_json)


def metrics(db="harness.db", *, run=None, experiment=None, summary=False, parse_json=True):
    """One row per stored value: run, experiment, trial, variant, point, name, value, unit, repeat
    (-1 for a value measured once or a summary). summary=True gives one row per (run, variant,
    point, name) with median, min, max and count over the repeats, as `harness show` summarises."""
    where, params = _filters(run, experiment, "m.run_id")
    frame = _query(db, _METRICS_SQL, "metrics", where, params, "m.id", parse_json=False)
    if summary:
        keys = ["run", "experiment", "variant", "point", "name", "unit"]
        # Per-repeat values summarise to medians; a value stored once (repeat -1) stands for
        # itself unless the same key also has repeats.
        repeated = frame["repeat"] >= 0
        has_repeats = repeated.groupby([frame[k] for k in keys]).transform("any")
        kept = frame[repeated | ~has_repeats]
        frame = kept.groupby(keys)["value"].agg(["median", "min", "max", "count"]).reset_index()
    if parse_json and "point" in frame:
        frame["point"] = frame["point"].map(json.loads)
    return frame


__all__ = ["runs", "trials", "metrics", "envs"]
