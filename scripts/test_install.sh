#!/usr/bin/env bash
# The pip route as a user takes it (the install test):
#   1. a fresh venv (python3 -m venv, no --system-site-packages) with torch==2.11.0 from PyPI
#      (pip's cache, or PIP_FIND_LINKS wheels, make the second time cheap);
#   2. `pip install <checkout>` builds the binary and the torch ops against that torch
#      (pyproject.toml: scikit-build-core, ccache, only the targets the package ships) — timed;
#   3. from another folder: the `harness` console script runs bwd_fusion on the CPU and its run is
#      ok with a verdict, and `import harness` trains a small DFlash-masked attention layer for a
#      few steps (the loss falls; the op matches the dense reference);
#   4. `pip install -e <checkout>` over the same build folder: the checkout's Python sources, the op
#      library and binary built (seconds, not a second build).
# Env: WORK_DIR (default a new temp dir; its venv is reused when it already has torch),
#      PIP_INSTALL_ARGS (e.g. "-C cmake.define.HARNESS_WITH_CUDA=OFF" to skip nvcc).
# Exit 0 only when every step passes; prints the seconds `pip install .` took.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${WORK_DIR:-$(mktemp -d /tmp/harness-install.XXXXXX)}
venv=$work/venv
log() { printf '[test_install] %s\n' "$*" >&2; }

if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  log "fresh venv $venv with torch==2.11.0"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check torch==2.11.0
fi
if "$venv/bin/python" -c 'import harness' 2>/dev/null; then "$venv/bin/pip" uninstall -q -y harness; fi

log "pip install $root"
start=$(date +%s)
# shellcheck disable=SC2086
"$venv/bin/pip" install -q --disable-pip-version-check ${PIP_INSTALL_ARGS:-} "$root"
log "pip install took $(( $(date +%s) - start )) s"
torch_count=$("$venv/bin/pip" list 2>/dev/null | grep -c '^torch ' || true)
[[ $torch_count == 1 ]] || { log "expected one torch in the venv, pip list shows $torch_count"; exit 1; }

elsewhere=$work/elsewhere
mkdir -p "$elsewhere" && cd "$elsewhere"
log "harness --version / run bwd_fusion --device cpu from $elsewhere"
"$venv/bin/harness" --version
"$venv/bin/harness" run bwd_fusion --device cpu --db "$elsewhere/harness.db" --json > run.json
"$venv/bin/python" - run.json <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["run"]
assert run["status"] == "ok", run
assert run["verdict"] not in ("", "INVALID"), run
print(f"bwd_fusion run {run['id']}: status {run['status']}, verdict {run['verdict']}")
PY

log "training a DFlash-masked attention layer through import harness"
"$venv/bin/python" - <<'PY'
import math
import torch
import harness

assert "site-packages" in harness.__file__, harness.__file__
torch.manual_seed(0)
context, block_size, anchors = 96, 8, torch.tensor([10, 31, 50, 77])
doc_id = torch.arange(context) // 48
mask = harness.DFlashMask(anchors, doc_id, context=context, block_size=block_size)
dim, heads, kv_heads = 64, 4, 2
head_dim = dim // heads


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * head_dim)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, draft, context_and_draft):
        b, lq, _ = draft.shape
        lkv = context_and_draft.shape[1]
        q = self.q(draft).view(b, lq, heads, head_dim).transpose(1, 2)
        k, v = self.kv(context_and_draft).view(b, lkv, 2, kv_heads, head_dim).unbind(2)
        out = harness.attention(q, k.transpose(1, 2), v.transpose(1, 2), mask)
        return self.o(out.transpose(1, 2).reshape(b, lq, dim))


layer = Layer()
draft = torch.randn(2, mask.q_len, dim)
context_and_draft = torch.randn(2, mask.kv_len, dim)
target = torch.randn(2, mask.q_len, dim)
optimizer = torch.optim.Adam(layer.parameters(), lr=1e-2)
losses = []
for step in range(8):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(layer(draft, context_and_draft), target)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
print("losses", " ".join(f"{x:.4f}" for x in losses))
assert losses[-1] < losses[0], losses

q = torch.randn(1, 4, mask.q_len, 16)
k = torch.randn(1, 2, mask.kv_len, 16)
v = torch.randn(1, 2, mask.kv_len, 16)
scores = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) / math.sqrt(16)
expected = torch.softmax(scores.masked_fill(~mask.dense(mask.q_len, mask.kv_len), float("-inf")), -1) @ v.repeat_interleave(2, 1)
assert torch.allclose(harness.attention(q, k, v, mask), expected, atol=1e-5)
print("trained", len(losses), "steps; the op matches the dense reference")
PY
log "HARNESS_CAPTURE through the installed harness-capture.pth: a failing script leaves its capture file"
rm -rf "$elsewhere/captures"
if HARNESS_CAPTURE="$elsewhere/captures" "$venv/bin/python" -c '
import torch, torch.nn.functional as F
x = torch.randn(1, 2, 16, 8)
F.scaled_dot_product_attention(x, x, x)
raise RuntimeError("planted after the attention call")' 2>/dev/null; then
  echo "the planted failure did not fail" >&2; exit 1
fi
ls "$elsewhere"/captures/capture-pid*.safetensors
log "pip install -e $root (the same build-pip/ folder: only what changed rebuilds)"
"$venv/bin/pip" uninstall -q -y harness
start=$(date +%s)
# shellcheck disable=SC2086
"$venv/bin/pip" install -q --disable-pip-version-check ${PIP_INSTALL_ARGS:-} -e "$root"
log "pip install -e took $(( $(date +%s) - start )) s"
"$venv/bin/harness" --version > /dev/null
"$venv/bin/python" - "$root" <<'PY'
import sys
from pathlib import Path
import torch
import harness

# Editable: the Python sources are the checkout's, the op library and binary the build's.
assert Path(harness.__file__).resolve().is_relative_to(Path(sys.argv[1]).resolve() / "python"), harness.__file__
print("editable harness from", harness.__file__, "ops from", harness.load_library())
q, k = torch.randn(1, 4, 40, 16), torch.randn(1, 2, 40, 16)
out = harness.attention(q, k, k, harness.CausalMask())
expected = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), k.repeat_interleave(2, 1), is_causal=True)
assert torch.allclose(out, expected, atol=1e-5)
PY
log "ok"
