#!/usr/bin/env python3
"""Measures how long `harness db merge` takes per 1000 trials (docs/RUNNING.md, "Scaling on paper").

Builds a main db with one Slurm run and shards for it whose trials are copies of real trials (with
their metrics, dispatch records and stderr tails) taken from a source db, then times one
`harness db merge` over all shards, as `harness slurm collect` merges them: one process, one
transaction per shard. Two shapes: one trial per shard (the default --trials-per-task 1) and
100 trials per shard.

    dev/measure_merge.py --harness build/harness/harness [--source-db DB] [--trials 1000]

Without --source-db it first runs `harness run anchor_scaling --device cpu` (12 real trials) into a
scratch db. Prints one line per shape and, with --json, a JSON summary.
"""
import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time


def harness(binary, *args):
    result = subprocess.run([binary, *args], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"`harness {' '.join(args)}` failed ({result.returncode}): {result.stderr[-2000:]}")
    return result.stdout


def columns(db, table, skip=()):
    return [row[1] for row in db.execute(f"PRAGMA table_info({table})") if row[1] not in skip]


def make_shard(binary, path, template, run_token, main_run_id, task, trials):
    harness(binary, "runs", "--db", path)  # creates the file at this binary's schema version
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = DELETE")
    src_trials, src_metrics, env, experiment = template
    db.execute("INSERT OR IGNORE INTO envs (id, json, created_at) VALUES (?, ?, ?)", env)
    db.execute("INSERT INTO experiments (id, name, spec, spec_hash, created_at) VALUES (1, ?, ?, ?, ?)", experiment)
    db.execute("INSERT INTO runs (id, experiment_id, env_id, device, profile, status, verdict, evidence, args, error,"
               " started_at, finished_at) VALUES (1, 1, ?, 'cpu', 'cpu', 'running', '', '{}', '{}', '', '', '')",
               (env[0],))
    db.execute("INSERT INTO shard_info (shard_run_id, main_run_id, run_token, task, attempt, slurm, created_at,"
               " finished_at) VALUES (1, ?, ?, ?, 0, '{}', 'now', 'now')", (main_run_id, run_token, task))
    trial_cols = columns(db, "trials", ("id", "run_id"))
    metric_cols = columns(db, "metrics", ("id", "run_id", "trial_id"))
    for i in range(trials):
        source = src_trials[i % len(src_trials)]
        values = dict(source)
        details = json.loads(values.get("details") or "{}")
        details["slurm"] = {"trial": task * trials + i, "task": task, "attempt": 0, "node": f"node{task % 64}"}
        values["details"] = json.dumps(details, sort_keys=True, separators=(",", ":"))
        cursor = db.execute(f"INSERT INTO trials (run_id, {', '.join(trial_cols)}) VALUES (1, {', '.join('?' * len(trial_cols))})",
                            [values[c] for c in trial_cols])
        trial_id = cursor.lastrowid
        for metric in src_metrics.get(source["id"], []):
            db.execute(f"INSERT INTO metrics (run_id, trial_id, {', '.join(metric_cols)}) VALUES (1, ?, {', '.join('?' * len(metric_cols))})",
                       [trial_id] + [metric[c] for c in metric_cols])
    db.commit()
    db.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", required=True)
    parser.add_argument("--source-db")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    binary = os.path.abspath(args.harness)
    work = tempfile.mkdtemp(prefix="harness-merge-")
    try:
        source = args.source_db
        if not source:
            source = os.path.join(work, "source.db")
            harness(binary, "run", "anchor_scaling", "--device", "cpu", "--db", source)
        src = sqlite3.connect(source)
        src.row_factory = sqlite3.Row
        trials = [dict(r) for r in src.execute("SELECT * FROM trials WHERE status = 'ok' ORDER BY id")]
        if not trials:
            sys.exit(f"{source}: no ok trials to copy")
        metrics = {}
        for r in src.execute("SELECT * FROM metrics WHERE trial_id IS NOT NULL"):
            metrics.setdefault(r["trial_id"], []).append(dict(r))
        env = tuple(src.execute("SELECT id, json, created_at FROM envs LIMIT 1").fetchone())
        experiment = tuple(src.execute("SELECT name, spec, spec_hash, created_at FROM experiments LIMIT 1").fetchone())
        per_trial_metrics = sum(len(v) for v in metrics.values()) / max(1, len(metrics))
        src.close()

        results = []
        for per_shard in (1, 100):
            shape_dir = os.path.join(work, f"shape-{per_shard}")
            os.makedirs(shape_dir)
            main_db = os.path.join(shape_dir, "main.db")
            harness(binary, "runs", "--db", main_db)
            db = sqlite3.connect(main_db)
            db.execute("INSERT INTO experiments (id, name, spec, spec_hash, created_at) VALUES (1, ?, ?, ?, ?)", experiment)
            token = "measure-merge"
            db.execute("INSERT INTO runs (id, experiment_id, env_id, device, profile, status, verdict, evidence, args,"
                       " error, started_at, finished_at) VALUES (1, 1, NULL, 'cpu', 'cpu', 'running', '', '{}', ?, '',"
                       " '', '')", (json.dumps({"slurm": {"token": token}}),))
            db.commit()
            db.close()
            shards = args.trials // per_shard
            # One shard is built, then copied with its task id changed: building each costs more than merging.
            template = os.path.join(shape_dir, "template.db")
            make_shard(binary, template, (trials, metrics, env, experiment), token, 1, 0, per_shard)
            paths = []
            for task in range(shards):
                path = os.path.join(shape_dir, f"task-{task}.attempt-0.db")
                shutil.copyfile(template, path)
                shard = sqlite3.connect(path)
                shard.execute("UPDATE shard_info SET task = ?", (task,))
                shard.commit()
                shard.close()
                paths.append(path)
            start = time.perf_counter()
            harness(binary, "db", "merge", *paths, "--into", main_db)
            seconds = time.perf_counter() - start
            start = time.perf_counter()
            harness(binary, "db", "merge", *paths, "--into", main_db)
            again = time.perf_counter() - start
            db = sqlite3.connect(main_db)
            merged = db.execute("SELECT count(*) FROM trials").fetchone()[0]
            db.close()
            if merged != shards * per_shard:
                sys.exit(f"merged {merged} trials, expected {shards * per_shard}")
            results.append({"trials_per_shard": per_shard, "shards": shards, "trials": merged,
                            "metrics_per_trial": round(per_trial_metrics, 1), "seconds": round(seconds, 3),
                            "seconds_per_1000_trials": round(seconds * 1000 / merged, 3),
                            "second_merge_seconds": round(again, 3),
                            "db_bytes": os.path.getsize(main_db)})
        for r in results:
            print(f"{r['shards']} shards × {r['trials_per_shard']} trial(s) ({r['metrics_per_trial']} metrics each): "
                  f"merge {r['seconds']:.2f} s = {r['seconds_per_1000_trials']:.2f} s per 1000 trials; "
                  f"merging them all again (nothing added) {r['second_merge_seconds']:.2f} s; db {r['db_bytes'] / 1e6:.1f} MB")
        if args.json:
            print(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
