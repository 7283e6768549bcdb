#!/usr/bin/env bash
# On the GPU machine, from the repository root, with a built harness (BUILD_DIR, default build/):
#   1. harness run bwd_fusion --model M --device cuda:0 for every model of `harness list --models`
#      (MODELS to pick some) with the default backward, and with the deterministic one for
#      DET_MODELS (default Qwen2.5-7B);
#   2. the planted wrong results (fault wrong_dq, wrong_dk_block) at Qwen2.5-7B: FUSED_BUT_WRONG;
#   3. a DFlash step per model computed by compiled flex_attention (dev/gpu/flex_model_steps.py,
#      STEP_MODELS to pick), replayed with `harness replay --import` on our kernels: MATCH, and the
#      flex outputs judged by the same rule.
# Writes $OUT/models.db and $OUT/model_matrix.txt (the tables). STEPS picks: runs, faults, flex.
set -uo pipefail
build=${BUILD_DIR:-build}
h=$build/harness/harness
out=${OUT:-out}
mkdir -p "$out"
db=$out/models.db
steps=" ${STEPS:-runs faults flex} "
models=${MODELS:-$("$h" list --models --json | python3 -c 'import json,sys; print(",".join(m["name"] for m in json.load(sys.stdin)))')}
report=$out/model_matrix.txt
: >"$report"
summary() { python3 "$(dirname "${BASH_SOURCE[0]}")/run_summary.py" "$1"; }  # run JSON on stdin -> one line
if [[ $steps == *" runs "* ]]; then
  for model in ${models//,/ }; do
    dets=false
    [[ ",${DET_MODELS:-Qwen2.5-7B}," == *",$model,"* ]] && dets="false true"
    for det in $dets; do
      id=$("$h" --db "$db" --json run bwd_fusion --device cuda:0 --model "$model" \
             --set variants.fused.deterministic=$det 2>>"$out/runs.stderr" | python3 -c 'import json,sys; print(json.load(sys.stdin)["run"]["id"])')
      "$h" --db "$db" --json show "$id" | summary "$model det=$det" | tee -a "$report"
    done
  done
fi
if [[ $steps == *" faults "* ]]; then
  for fault in wrong_dq wrong_dk_block; do
    id=$(HARNESS_ALLOW_FAULTS=1 "$h" --db "$db" --json run bwd_fusion --device cuda:0 --model Qwen2.5-7B \
           --set variants.fused.fault=$fault 2>>"$out/runs.stderr" | python3 -c 'import json,sys; print(json.load(sys.stdin)["run"]["id"])')
    "$h" --db "$db" --json show "$id" | summary "Qwen2.5-7B fault=$fault" | tee -a "$report"
  done
fi
if [[ $steps == *" flex "* ]]; then
  steps_dir=${STEPS_DIR:-$out/steps}
  python3 dev/gpu/flex_model_steps.py --out "$steps_dir" --models "${STEP_MODELS:-$models}" --harness "$h" \
    | tee -a "$report"
  for step in "$steps_dir"/*.pt; do
    "$h" --db "$db" --json replay --import "$step" --device cuda:0 2>>"$out/runs.stderr" | python3 -c '
import json, sys
r = json.load(sys.stdin)
imp = r.get("imported_check", {})
print(sys.argv[1], "|", r["verdict"], "|", r["reason"][:900], "| flex:", "MATCH" if imp.get("match") else imp)' "$(basename "$step")" \
      | tee -a "$report"
  done
fi
echo "== $report"
