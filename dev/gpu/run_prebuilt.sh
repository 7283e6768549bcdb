#!/usr/bin/env bash
# Runs ON the H200 image (from the repo root) with binaries built on the Debian machine and copied
# in .gpu/bin (dev/gpu/pack_build.sh makes it): the same torch 2.11.0+cu130 on both, so nothing is
# built on the GPU machine. Tests have the Debian build folder's absolute paths compiled in: they are
# recreated here as links (HARNESS_BUILT_ROOT: the source root the binaries were built in). Logs go to $OUT. STEPS picks what runs (default: all below but
# bench and evidence):
#   selftest  the kernels alone against fp32/float64 references, timed at the real dims
#             (SELFTEST_ARGS, e.g. --only TEXT)
#   tests     [cuda] Catch2 cases (torch and CLI)
#   bwd       harness run bwd_fusion --device cuda:0, default (atomic) and deterministic backward
#   python    pytest tests/python on CUDA, then bench/python_vs_cpp.py
#   slurm     dev/gpu/gpu_check_slurm.sh
#   faults    dev/gpu/gpu_check_reliability.sh
#   evidence  dev/gpu/gpu_check_evidence.sh
#   host      the host side of a fused call: host µs per call and the phase time as the harness
#             measures it against the kernels' back-to-back time (harness_bench_attention)
#   ncu       dev/gpu/ncu_kernels.sh: Nsight Compute on the fwd/bwd kernels (NCU_CASES), and a peer's
#             (PEER_CASES, e.g. "causal-128:fa4"; flash-attn-4 installed as the bench step does)
#   bench     bench/attention_vs_flex.py (CASES, PEERS, BUDGET_S)
#   sweep     dev/gpu/kernel_sweep.sh: every kernel forced on SWEEP_CASES, beside the heuristic's and
#             the autotuner's pick (not in the default STEPS)
#   peaks     bwd_fusion's fused peaks that the memory model's test checks (not in the default STEPS)
#   matrix    dev/gpu/model_matrix.sh (MATRIX_STEPS, default flex: compiled-flex steps per model
#             replayed with --import)
#   capture   dev/gpu/gpu_check_capture.sh $CAPTURE_STAGES (default capture triage), writing into
#             /tmp/harness-capture (kept on a warm machine for a later command) and copied to $OUT
#   ab        bench/selftest_ab.py run over the two self-tests `selftest_ab.py build` wrote into
#             AB_DIR (default .gpu-ab: selftest_old, selftest_new), AB_ROUNDS rounds (default 2),
#             AB_ONLY the cases (the self-test's filters separated by ';', default every REAL case)
#             (not in the default STEPS)
# A .whl/fa4-part1 in the tree (half of flash-attn-4's wheels, dev/gpu/fa4_wheels.sh) is copied to
# /tmp/fa4-part1 whatever the steps, so that a later command on the same machine, sent with the
# other half, finds both.
set -uo pipefail
root=$PWD
out=${OUT:-$root/out}
mkdir -p "$out"
built=${HARNESS_BUILT_ROOT:?set HARNESS_BUILT_ROOT to the source root the binaries were built in}
steps=" ${STEPS:-selftest tests bwd python slurm faults} "
want() { [[ $steps == *" $1 "* ]]; }
step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

# The binaries: .gpu/ as copied, else unpacked from .gpu-pack/gpu.tar.gz, else the copy an earlier
# command left in /tmp/harness-gpu on this machine (a command sent with wheels can then leave them out).
if [[ ! -d .gpu/bin && -f .gpu-pack/gpu.tar.gz ]]; then tar -xzf .gpu-pack/gpu.tar.gz; fi
if [[ -d .gpu/bin ]]; then rm -rf /tmp/harness-gpu && cp -r .gpu /tmp/harness-gpu
elif [[ -d /tmp/harness-gpu/bin ]]; then cp -r /tmp/harness-gpu .gpu && echo "binaries from an earlier command (/tmp/harness-gpu)"
fi
# The Debian tree's paths, pointing here; the build folder filled from .gpu/bin.
if [[ $built != "$root" ]]; then
  mkdir -p "$built"
  for entry in "$root"/* "$root"/.deps; do [[ -e $entry ]] && ln -sfn "$entry" "$built/$(basename "$entry")"; done
  rm -f "$built/build"
fi
build=$built/build
mkdir -p "$build"/{harness,tests,bench,python,kernels/cuda}
[[ -f .gpu/bin/harness ]] && cp .gpu/bin/harness "$build/harness/"
for t in harness_unit_tests harness_torch_tests harness_cli_tests; do [[ -f .gpu/bin/$t ]] && cp .gpu/bin/$t "$build/tests/"; done
for t in harness_bench_attention harness_mask_describe harness_bench_prep_bandwidth; do [[ -f .gpu/bin/$t ]] && cp .gpu/bin/$t "$build/bench/"; done
[[ -f .gpu/bin/libharness_ops.so ]] && cp .gpu/bin/libharness_ops.so "$build/python/"
[[ -f .gpu/bin/harness_attention_selftest ]] && cp .gpu/bin/harness_attention_selftest "$build/bench/"
torch_lib=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
export LD_LIBRARY_PATH=$root/.gpu/lib:$torch_lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export BUILD_DIR=$build OUT=$out
# The binaries' commit (recorded by dev/gpu/pack_build.sh), for the bench's header.
[[ -f .gpu/bin/git_commit ]] && export HARNESS_BINARIES_COMMIT=$(cat .gpu/bin/git_commit)
h=$build/harness/harness
"$h" env --device cuda:0 >"$out/env.txt" 2>&1
# shellcheck source=dev/gpu/fa4_env.sh
source dev/gpu/fa4_env.sh && fa4_keep_part1 "$root"

if want selftest; then
  step "kernel self-test"
  # SELFTEST_ARGS: e.g. --small, --only TEXT.
  # shellcheck disable=SC2086
  timeout 300 "$build/bench/harness_attention_selftest" ${SELFTEST_ARGS:-} --log "$out/selftest.log" >/dev/null 2>&1; echo "rc=$?"
  grep -E '^\||PASSED|FAILED|ERROR' "$out/selftest.log" | tail -40
fi
if want tests; then
  step "[cuda] torch tests"
  timeout 300 "$build/tests/harness_torch_tests" "[cuda]" >"$out/cuda_tests.log" 2>&1; echo "rc=$?"; tail -3 "$out/cuda_tests.log"
  step "[cuda] CLI tests"
  timeout 200 "$build/tests/harness_cli_tests" "[cuda]" >"$out/cli_cuda.log" 2>&1; echo "rc=$?"; tail -3 "$out/cli_cuda.log"
fi
if want bwd; then
  step "bwd_fusion (default kernels)"
  "$h" run bwd_fusion --device cuda:0 --db "$out/h200.db" 2>&1 | tee "$out/bwd_fusion.txt" | tail -22
  step "bwd_fusion (deterministic backward, forward wgmma_m64_n64 forced)"
  "$h" run bwd_fusion --device cuda:0 --db "$out/h200.db" --set variants.fused.deterministic=true \
    --set variants.fused.kernel.fwd=wgmma_m64_n64 2>&1 | tee "$out/bwd_fusion_det.txt" | tail -22
  "$h" show 2 --db "$out/h200.db" 2>&1 | grep -A12 'dispatch' | head -16
fi
if want peaks; then
  # The peaks tests/test_memory_model.cpp checks the model against: bwd_fusion with the
  # deterministic backward, at the spec's dims and at 512 anchors x 5 layers.
  step "memory peaks (bwd_fusion, deterministic backward)"
  for dims in "" "--set dims.anchors=512 --set dims.layers=5"; do
    # shellcheck disable=SC2086
    "$h" run bwd_fusion --device cuda:0 --db "$out/peaks.db" --set variants.fused.deterministic=true $dims 2>&1 |
      tee -a "$out/peaks.txt" | grep -E "peak|verdict|dispatch" | head -12
  done
fi
if want python; then
  step "python: pytest tests/python on CUDA"
  export HARNESS_OPS_LIBRARY=$build/python/libharness_ops.so HARNESS_BIN=$h HARNESS_REQUIRE_NATIVE=1
  # The browser tests (site, exports, Perfetto) are CTest's own entries: the image has no Chromium,
  # and their fixture ends the whole pytest run when none starts.
  timeout "${PYTEST_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider -rs ${PYTEST_PATHS:-tests/python \
    --ignore=tests/python/test_bench_masks.py --ignore=tests/python/test_site.py --ignore=tests/python/test_exports.py \
    --ignore=tests/python/test_perfetto.py} \
    >"$out/pytest.log" 2>&1; echo "rc=$?"; tail -8 "$out/pytest.log"
  step "python: the op from Python vs the kernels from C++"
  timeout "${PYVSCPP_TIMEOUT:-300}" python3 bench/python_vs_cpp.py --binary "$build/bench/harness_bench_attention" >"$out/python_vs_cpp.log" 2>&1
  echo "rc=$?"; tail -25 "$out/python_vs_cpp.log"
fi
if want slurm; then step "slurm GPU check"; timeout 120 dev/gpu/gpu_check_slurm.sh 2>&1 | tail -5; fi
if want faults; then step "faults GPU check"; timeout 200 dev/gpu/gpu_check_reliability.sh 2>&1 | tail -8; fi
if want evidence; then step "evidence GPU check"; timeout 400 dev/gpu/gpu_check_evidence.sh 2>&1 | tail -25; fi
if want host; then
  step "host side of a fused call (harness_bench_attention)"
  for flags in "--mask dflash --anchors 128" "--mask dflash --anchors 512" "--mask causal --anchors 128"; do
    timeout 120 "$build/bench/harness_bench_attention" $flags --impl fused --reps 30 >"$out/host.json" 2>/dev/null
    python3 - "$out/host.json" "$flags" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print(f"{sys.argv[2]:30s} kernels fwd {r['fwd_ms']:.4f} bwd {r['bwd_ms']:.4f} ms | phase fwd {r['phase_fwd_ms']:.4f} "
      f"(+{100 * (r['phase_fwd_ms'] / r['fwd_ms'] - 1):.1f}%) bwd {r['phase_bwd_ms']:.4f} (+{100 * (r['phase_bwd_ms'] / r['bwd_ms'] - 1):.1f}%) "
      f"| host fwd {r['host_fwd_us']:.1f} us bwd {r['host_bwd_us']:.1f} us")
PY
  done
fi
if want ncu; then
  step "Nsight Compute on the kernels"
  # PEER_CASES (e.g. "causal-128:fa4"): a peer's kernels too, with flash-attn-4 installed on this
  # machine: by an earlier command's bench step, or here when this command brings the wheels'
  # second half (.whl/fa4-part2; the first half in the tree or left in /tmp by an earlier command).
  fa4_install "$root" && fa4_path
  BENCH=$build/bench/harness_bench_attention CASES="${NCU_CASES:-causal-128 dflash-512 dflash-128}" \
    timeout "${NCU_TIMEOUT:-240}" dev/gpu/ncu_kernels.sh 2>&1 | tail -"${NCU_TAIL:-80}"
fi
if want sweep; then
  step "every kernel forced (dev/gpu/kernel_sweep.sh)"
  BENCH=$build/bench/harness_bench_attention timeout "${SWEEP_TIMEOUT:-540}" dev/gpu/kernel_sweep.sh
fi
if want ab; then
  step "kernel A/B: $(cat "${AB_DIR:-.gpu-ab}/old_commit" 2>/dev/null || echo old) against this tree's kernels"
  ab=${AB_DIR:-.gpu-ab}
  only=()  # AB_ONLY: the self-test's case filters, separated by ';' (default: every REAL case)
  IFS=';' read -ra filters <<<"${AB_ONLY:-}"
  for f in "${filters[@]}"; do [[ -n $f ]] && only+=(--only "$f"); done
  timeout "${AB_TIMEOUT:-540}" python3 bench/selftest_ab.py run "$ab/selftest_old" "$ab/selftest_new" \
    --rounds "${AB_ROUNDS:-2}" "${only[@]}" --log-dir "$out/ab" 2>&1 | tail -80
fi
if want bench; then
  step "fair benchmark"
  SKIP_BUILD=1 timeout "${BENCH_TIMEOUT:-560}" dev/gpu/gpu_check_bench.sh 2>&1 | tail -40
fi
if want matrix; then
  step "model matrix (${MATRIX_STEPS:-flex})"
  STEPS_DIR=/tmp/harness-steps STEPS=${MATRIX_STEPS:-flex} timeout "${MATRIX_TIMEOUT:-500}" dev/gpu/model_matrix.sh 2>&1 | tail -40
fi
if want capture; then
  step "capture and triage (${CAPTURE_STAGES:-capture triage})"
  # shellcheck disable=SC2086
  OUT=/tmp/harness-capture BUILD_DIR=$build timeout "${CAPTURE_TIMEOUT:-560}" dev/gpu/gpu_check_capture.sh \
    ${CAPTURE_STAGES:-capture triage} 2>&1 | tail -40
  rm -rf "$out/capture" && mkdir -p "$out/capture"
  (cd /tmp/harness-capture && find . -type f ! -name '*.safetensors' ! -name '*.db' -size -4M -exec cp --parents {} "$out/capture/" \;)
fi
