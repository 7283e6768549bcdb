"""harness.save_step writes the format `harness replay --import` reads (replay/README.md)."""

import json
import subprocess
import sys

import pytest
import torch

import harness
from conftest import ROOT


def tensors(q_len=10, kv_len=30):
    q = torch.randn(1, 4, q_len, 8)
    k = torch.randn(1, 2, kv_len, 8)
    return q, k, torch.randn_like(k), torch.randn_like(q)


def test_a_mask_object_saves_its_description_anchors_and_documents(tmp_path):
    mask = harness.DFlashMask(torch.tensor([4, 11]), torch.tensor([0] * 9 + [1] * 11), context=20, block_size=5,
                              context_rule="through_anchor", in_block="causal")
    q, k, v, grad_out = tensors()
    harness.save_step(tmp_path / "step.pt", q, k, v, grad_out, mask=mask, outputs={"out": q * 2})
    saved = torch.load(tmp_path / "step.pt")
    meta = json.loads(saved["meta"])
    assert meta["mask"] == {"type": "dflash", "context_rule": "through_anchor", "in_block": "causal"}
    assert meta["dims"]["block_size"] == 5
    assert saved["anchors"].tolist() == [4, 11] and saved["anchors"].dtype == torch.int64
    assert saved["doc_id"].dtype == torch.int32 and saved["doc_id"].numel() == 20
    assert torch.equal(saved["q"], q) and torch.equal(saved["out"], q * 2)


def test_layers_and_dict_descriptions(tmp_path):
    layers = [tensors(), tensors()]
    q, k, v, grad_out = [list(t) for t in zip(*layers)]
    harness.save_step(tmp_path / "step.pt", q, k, v, grad_out, mask={"type": "causal"}, heads=4)
    saved = torch.load(tmp_path / "step.pt")
    assert sorted(key for key in saved if key.startswith("q.")) == ["q.0", "q.1"]
    # block_size is dflash's draft block: a causal step whose Q_LEN (10) 16 does not divide takes 1.
    assert json.loads(saved["meta"])["dims"] == {"block_size": 1, "heads": 4}


def test_bad_arguments(tmp_path):
    q, k, v, grad_out = tensors()
    with pytest.raises(ValueError, match="q must be 4-D"):
        harness.save_step(tmp_path / "s.pt", q[0], k, v, grad_out, mask={"type": "causal"})
    with pytest.raises(TypeError, match="k must be a list of tensors like q"):
        harness.save_step(tmp_path / "s.pt", [q], k, [v], [grad_out], mask={"type": "causal"})
    with pytest.raises(TypeError, match="mask must be a harness mask or a dict"):
        harness.save_step(tmp_path / "s.pt", q, k, v, grad_out, mask="causal")


def test_the_replay_folder_helper_still_imports(tmp_path):
    # Scripts written against replay/save_step.py keep working without the package installed.
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'replay')!r}); from save_step import save_step; "
            "import harness.steps; assert save_step is harness.steps.save_step")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
