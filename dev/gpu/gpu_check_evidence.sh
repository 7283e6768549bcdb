#!/usr/bin/env bash
# Runs ON the H200 image from the repo root (evidence in PyTorch's formats). Builds the
# harness with dev/gpu/h200_build.sh, then
#   1. the founding OOM with its allocator snapshot:
#        harness run anchor_scaling --device cuda:0 --memory-limit 96GiB --memory-snapshot
#      expects the dense trial at anchors=512 layers=5 to end `oom` and keep a memory_snapshot
#      artifact whose largest block is 16.00 GiB (the scores tensor), `harness show` naming it,
#      PyTorch's own memory_viz reading it (stats, and trace_plot to snapshot.html), and the
#      writeup embedding its SVGs;
#   2. a small real snapshot for tests/data: tests/cli/replay_small.json on cuda:0 with
#      --memory-snapshot, the dense trial's pickle copied to $OUT/snapshot_h200.pickle (commit it as
#      tests/data/snapshot_h200.pickle; tests/test_memory_snapshot.cpp then reads it);
#   3. `harness run bwd_fusion --device cuda:0 --trace`: the Chrome trace JSON of each trial, its
#      kernels (attention_fwd*_kernel, attention_bwd*_kernel) and the harness ranges, labelled with
#      the dispatch trace's implementation, kernel and config; loaded by Perfetto's trace processor
#      when the `perfetto` package and its trace_processor_shell binary are there (that binary is a
#      download, and the image has no network: set TRACE_PROCESSOR_BIN to a copy sent with the tree), else
#      parsed as JSON (said so in the log);
#   4. `harness explain-oom "Tried to allocate 15.09 GiB" --spec anchor_scaling --set dims.anchors=512
#      --set dims.layers=5 --solve dims.context`, and the solved point run dense under
#      --memory-limit 96GiB: its OOM asks for the same 15.09 GiB.
# Logs and files go to $OUT (or ./gpu_check_evidence.out). Exit status 0 only when every check passes.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$root/gpu_check_evidence.out}
mkdir -p "$out"
build_dir=${BUILD_DIR:-$root/build-h200}
# A harness already there (dev/gpu/run_prebuilt.sh puts the prebuilt one there) is used as it is.
[[ -x $build_dir/harness/harness ]] || BUILD_TARGETS="harness" BUILD_DIR=$build_dir "$root/dev/gpu/h200_build.sh" > "$out/build.log" 2>&1 ||
  { echo "build failed (see $out/build.log)"; tail -30 "$out/build.log"; exit 2; }
harness=$build_dir/harness/harness
failures=0
check() {  # check NAME COMMAND...: runs it, prints PASS/FAIL
  local name=$1; shift
  if "$@"; then echo "PASS $name"; else echo "FAIL $name"; failures=$((failures + 1)); fi
}

# 1. The founding OOM and its snapshot ---------------------------------------------------------------
db=$out/evidence.db
timeout 550 "$harness" run anchor_scaling --device cuda:0 --memory-limit 96GiB --memory-snapshot --db "$db" --json \
  > "$out/anchor_scaling.json" 2> "$out/anchor_scaling.err"
echo "anchor_scaling rc=$?"
run_id=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['run']['id'])" "$out/anchor_scaling.json" 2>/dev/null)
"$harness" show "$run_id" --db "$db" > "$out/show.txt" 2>&1
sed -n '/^artifacts/,$p' "$out/show.txt" | head -40
snapshot=$(python3 - "$out/anchor_scaling.json" "$db" <<'EOF'
import json, os, sys
run = json.load(open(sys.argv[1]))
trial = next(t for t in run["trials"] if t["variant"] == "dense" and t["point"].get("dims.anchors") == 512
             and t["point"].get("dims.layers") == 5)
print(f"dense anchors=512 layers=5: status {trial['status']}, requested {trial['requested_bytes']}", file=sys.stderr)
snap = next(a for a in run["artifacts"] if a["kind"] == "memory_snapshot" and a.get("trial_id") == trial["id"])
print(os.path.join(os.path.dirname(os.path.abspath(sys.argv[2])), snap["path"]))
EOF
)
check "the dense 512x5 trial ends oom and keeps a snapshot" test -s "$snapshot"
check "harness show names the snapshot and memory_viz" grep -q "memory_viz: python -m torch.cuda._memory_viz" "$out/show.txt"
check "the snapshot's largest block is the 16 GiB scores tensor" grep -qE "largest block 16\.0+ GiB, OOM asking 16\.0+ GiB" "$out/show.txt"
python3 -m torch.cuda._memory_viz stats "$snapshot" > "$out/memory_viz_stats.txt" 2>&1
check "PyTorch's memory_viz reads it (stats)" test $? -eq 0
python3 -m torch.cuda._memory_viz trace_plot "$snapshot" -o "$out/snapshot.html" > /dev/null 2>&1
check "memory_viz trace_plot writes the HTML (screenshot it with dev/memory_viz_screenshot.py)" test -s "$out/snapshot.html"
cp "$snapshot" "$out/anchor_scaling_oom.snapshot.pickle" 2>/dev/null
mkdir -p "$out/writeup"
"$harness" writeup "$run_id" --db "$db" -o "$out/writeup/anchor_scaling.md" > "$out/writeup.log" 2>&1
check "the writeup embeds the snapshot SVGs" test -s "$out/writeup/anchor_scaling-snapshot-1-peak.svg"
grep -A2 "Snapshot of" "$out/writeup/anchor_scaling.md" | head -8

# 2. A small real snapshot for tests/data --------------------------------------------------------------
small_db=$out/small.db
HARNESS_ALLOW_FAULTS=1 "$harness" run "$root/tests/cli/replay_small.json" --device cuda:0 --memory-snapshot --db "$small_db" --json \
  > "$out/small.json" 2> "$out/small.err"
python3 - "$out/small.json" "$small_db" "$out/snapshot_h200.pickle" <<'EOF'
import json, os, shutil, sys
run = json.load(open(sys.argv[1]))
snaps = [a for a in run["artifacts"] if a["kind"] == "memory_snapshot"]
print(f"small run: {len(snaps)} snapshot(s), {[a['bytes'] for a in snaps]} bytes")
dense = next(t for t in run["trials"] if t["variant"] == "dense")
best = next(a for a in snaps if a.get("trial_id") == dense["id"])
shutil.copy(os.path.join(os.path.dirname(os.path.abspath(sys.argv[2])), best["path"]), sys.argv[3])
EOF
check "a small real snapshot for tests/data (snapshot_h200.pickle)" test -s "$out/snapshot_h200.pickle"

# 3. --trace of bwd_fusion ------------------------------------------------------------------------------
trace_db=$out/trace.db
timeout 300 "$harness" run bwd_fusion --device cuda:0 --trace --db "$trace_db" --json > "$out/bwd_fusion.json" 2> "$out/bwd_fusion.err"
echo "bwd_fusion --trace rc=$?"
python3 - "$out/bwd_fusion.json" "$trace_db" "$out" <<'EOF' > "$out/trace_check.txt" 2>&1
import json, os, shutil, sys
run = json.load(open(sys.argv[1]))
base = os.path.dirname(os.path.abspath(sys.argv[2]))
traces = [os.path.join(base, a["path"]) for a in run["artifacts"] if a["kind"] == "trace"]
print(f"{len(traces)} trace(s)")
ok = bool(traces)
for path in traces:
    events = json.load(open(path))["traceEvents"]
    kernels = sorted({e["name"] for e in events if e.get("cat") == "kernel"})
    ranges = sorted({e["name"] for e in events if e.get("name", "").startswith("harness ")})
    print(path, "\n  kernels:", kernels[:12], "\n  ranges:", ranges[:6])
    ok = ok and bool(ranges)
ours = any("attention_fwd" in k or "attention_bwd" in k for p in traces
           for k in {e["name"] for e in json.load(open(p))["traceEvents"] if e.get("cat") == "kernel"})
print("our kernels in the traces:", ours)
shutil.copy(traces[0], os.path.join(sys.argv[3], "bwd_fusion.trace.json")) if traces else None
# Perfetto's trace processor, when its binary is available (no network here: TRACE_PROCESSOR_BIN).
try:
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    config = TraceProcessorConfig(bin_path=os.environ.get("TRACE_PROCESSOR_BIN"))
    with TraceProcessor(trace=traces[0], config=config) as tp:
        rows = list(tp.query("select name, count(*) as n from slice where name like '%attention%' group by name"))
        print("perfetto slices:", [(r.name, r.n) for r in rows])
        ours = ours and bool(rows)
except Exception as error:  # noqa: BLE001 - any failure to start the processor is reported, not fatal
    print("perfetto trace processor not run:", type(error).__name__, error)
sys.exit(0 if ok and ours else 1)
EOF
check "bwd_fusion --trace: Chrome traces with our kernels and harness ranges" test $? -eq 0
cat "$out/trace_check.txt"

# 4. explain-oom --solve and the solved point under the cap ------------------------------------------
"$harness" explain-oom "CUDA out of memory. Tried to allocate 15.09 GiB" --spec anchor_scaling --set dims.anchors=512 \
  --set dims.layers=5 --solve dims.context > "$out/solve.txt" 2>&1
cat "$out/solve.txt"
context=$("$harness" explain-oom "Tried to allocate 15.09 GiB" --spec anchor_scaling --set dims.anchors=512 \
  --set dims.layers=5 --solve dims.context --json | python3 -c "
import json, sys
s = json.load(sys.stdin)['solves'][0]['solutions']
print(next(x['best'] for x in s if x['tensor'] == 'scores'))")
echo "solved context: $context"
"$harness" run anchor_scaling --device cuda:0 --memory-limit 96GiB --set dims.anchors=512 --set dims.layers=5 \
  --set dims.context="$context" --set repeats=1 --db "$out/solved.db" --json > "$out/solved.json" 2> "$out/solved.err"
python3 - "$out/solved.json" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))
dense = next(t for t in run["trials"] if t["variant"] == "dense")
gib = (dense["requested_bytes"] or 0) / 2**30
print(f"solved point, dense: status {dense['status']}, requested {dense['requested_bytes']} B = {gib:.2f} GiB")
sys.exit(0 if dense["status"] == "oom" and f"{gib:.2f}" == "15.09" else 1)
EOF
check "the solved point's OOM asks for 15.09 GiB" test $? -eq 0

echo "failures: $failures"
[[ $failures -eq 0 ]]
