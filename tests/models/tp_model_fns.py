"""Functions run on each rank of a RankPool(2) by test_tp_models.py (importable by name there):
a tiny checkpoint loaded with tp=2 on every rank, one prefill step through the torch attention
backend's paged cache, logits on the TP group's rank 0 (None on the other); rank 0 also runs
the same step on the TP=1 model for the test to compare."""

from __future__ import annotations

import torch

from lab.attention.torch_backend import TorchAttentionBackend
from lab.models.loader import load_model
from tests.models.prefill import prefill_logits

PROMPT = [0, 5, 17, 300, 42, 7, 99, 511, 2, 77, 130]


def tp_and_tp1_logits(state, path: str, expert_parallel: bool = False,
                      quant: str | None = None) -> dict:
    """This rank's TP logits (None off rank 0), its attention spec, and (rank 0) TP=1's logits;
    quant: None (dense) or "int8" (every linear W8A8, experts int8; rank 0 then also returns
    the dense TP=1 logits)."""
    from lab.quant.int8 import Int8Config

    backend = TorchAttentionBackend()
    make_quant = (lambda: Int8Config()) if quant == "int8" else (lambda: None)
    model, _ = load_model(path, backend, torch.float32, "cpu", quant=make_quant(), tp=state.tp,
                          expert_parallel=expert_parallel)
    out = {"logits": prefill_logits(model, backend, PROMPT),
           "spec": (model.attention_spec.num_heads, model.attention_spec.num_kv_heads,
                    model.attention_spec.head_dim)}
    if state.tp.is_first_rank:
        ref, _ = load_model(path, backend, torch.float32, "cpu", quant=make_quant())
        out["ref"] = prefill_logits(ref, backend, PROMPT)
        if quant is not None:
            dense, _ = load_model(path, backend, torch.float32, "cpu")
            out["dense"] = prefill_logits(dense, backend, PROMPT)
    return out


def rank_params(state, path: str, expert_parallel: bool = False) -> dict:
    """This rank's parameter count (each storage once) and weight bytes, its model loaded with
    tp=2 in fp32: what the simulator's per-rank ModelShape must equal."""
    from lab.quant.base import weight_bytes

    model, _ = load_model(path, TorchAttentionBackend(), torch.float32, "cpu", tp=state.tp,
                          expert_parallel=expert_parallel)
    storages = {p.untyped_storage().data_ptr(): p.numel() for p in model.parameters()}
    return {"params": sum(storages.values()), "weight_bytes": weight_bytes(model)}
