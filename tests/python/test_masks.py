"""Mask objects: each kind against a brute-force transcription of kernels/mask_desc.cpp's
predicate, and bad arguments rejected with the argument named."""

import pytest
import torch

import harness


def brute_force(mask, q_len, kv_len):
    """visible(q, kv) element by element, as ResolvedMask::visible spells it."""
    dense = torch.zeros(q_len, kv_len, dtype=torch.bool)
    for q in range(q_len):
        q_abs = q + kv_len - q_len
        for kv in range(kv_len):
            if mask.kind == "full":
                seen = True
            elif mask.kind == "causal":
                seen = kv <= q_abs
            elif mask.kind == "sliding_window":
                seen = q_abs - mask.window < kv <= q_abs
            elif mask.kind == "document_causal":
                doc = mask.doc_id.tolist()
                seen = q_abs >= 0 and kv <= q_abs and doc[kv] == doc[q_abs]
            else:
                block = q // mask.block_size
                anchor = int(mask.anchors[block])
                doc = mask.doc_id.tolist()
                if kv < mask.context:
                    end = anchor + 1 if mask.context_rule == "through_anchor" else anchor
                    seen = kv < end and doc[kv] == doc[anchor]
                else:
                    begin = mask.context + block * mask.block_size
                    end = mask.context + q + 1 if mask.in_block == "causal" else begin + mask.block_size
                    seen = begin <= kv < end
            dense[q, kv] = seen
    return dense


def dflash(context_rule="before_anchor", in_block="bidirectional"):
    doc_id = torch.tensor([0] * 13 + [1] * 9 + [2] * 19)  # context 41, three documents
    return harness.DFlashMask(torch.tensor([3, 14, 30, 13]), doc_id, context=41, block_size=5,
                              context_rule=context_rule, in_block=in_block)


MASKS = {
    "dflash": lambda: dflash(),
    "dflash_through_causal": lambda: dflash("through_anchor", "causal"),
    "causal": harness.CausalMask,
    "document_causal": lambda: harness.DocumentCausalMask(torch.tensor([0] * 20 + [1] * 25 + [2] * 16)),
    "sliding_window": lambda: harness.SlidingWindowMask(7),
    "full": harness.FullMask,
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_dense_matches_the_predicate(name):
    mask = MASKS[name]()
    q_len, kv_len = (mask.q_len, mask.kv_len) if name.startswith("dflash") else (37, 61)
    assert torch.equal(mask.dense(q_len, kv_len), brute_force(mask, q_len, kv_len))


def test_dflash_geometry():
    mask = dflash()
    assert (mask.q_len, mask.kv_len) == (20, 61)
    # A query sees its own draft block and, before_anchor, the context of its anchor's document only.
    dense = mask.dense(20, 61)
    assert dense[0, :3].all() and not dense[0, 3:41].any()      # anchor 3 in document 0
    assert not dense[5, :13].any() and dense[5, 13] and not dense[5, 14]  # anchor 14: doc 1 starts at 13
    assert dense[0, 41:46].all() and not dense[0, 46:].any()


def test_causal_is_bottom_right_aligned():
    dense = harness.CausalMask().dense(3, 5)
    assert dense.tolist() == [[True, True, True, False, False], [True] * 4 + [False], [True] * 5]


@pytest.mark.parametrize("make, message", [
    (lambda: harness.DFlashMask(torch.tensor([0, 50]), context=41), "anchors must lie in the context"),
    (lambda: harness.DFlashMask(torch.tensor([-1]), context=41), "anchors must lie in the context"),
    (lambda: harness.DFlashMask(torch.tensor([1]), torch.zeros(40, dtype=torch.long), context=41), "doc_id must name"),
    (lambda: harness.DFlashMask(torch.tensor([1]), context=41, context_rule="after"), "context_rule must be one of"),
    (lambda: harness.DFlashMask(torch.tensor([1]), context=41, in_block="sideways"), "in_block must be one of"),
    (lambda: harness.DFlashMask(torch.tensor([1]), context=41, block_size=0), "block_size must be >= 1"),
    (lambda: harness.DFlashMask(torch.tensor([], dtype=torch.long), context=41), "anchors must hold at least one"),
    (lambda: harness.DFlashMask(torch.tensor([[1]]), context=41), "anchors must be 1-D"),
    (lambda: harness.DFlashMask(torch.tensor([1])), "context is required"),
    (lambda: harness.SlidingWindowMask(0), "window must be >= 1"),
    (lambda: harness.DocumentCausalMask(torch.tensor([0, -1])), "doc_id must be >= 0"),
])
def test_bad_arguments_raise_value_error_naming_them(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("make, message", [
    (lambda: harness.DFlashMask(torch.tensor([1.5]), context=41), "anchors must hold integers"),
    (lambda: harness.SlidingWindowMask(2.5), "window must be an int"),
    (lambda: harness.DocumentCausalMask(torch.ones(4)), "doc_id must hold integers"),
])
def test_bad_types_raise_type_error_naming_them(make, message):
    with pytest.raises(TypeError, match=message):
        make()


def test_lengths_are_checked_against_the_mask():
    with pytest.raises(ValueError, match="Q_LEN 19 but the mask has 4 anchors x block_size 5 = 20"):
        dflash().check(19, 60)
    with pytest.raises(ValueError, match="KV_LEN 60 but the mask needs context 41"):
        dflash().check(20, 60)
    with pytest.raises(ValueError, match="doc_id has 61 entries but k and v have KV_LEN 62"):
        MASKS["document_causal"]().check(10, 62)


def test_each_mask_gets_its_own_uid():
    assert harness.CausalMask().uid != harness.CausalMask().uid
