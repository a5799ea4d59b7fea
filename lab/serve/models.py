"""GET /v1/models: the one model a server serves, under its served name; its `root` is the
checkpoint directory, as in vLLM."""

from __future__ import annotations

from fastapi import APIRouter

from lab.serve.state import State

router = APIRouter(tags=["models"])


@router.get("/v1/models")
async def models(state: State) -> dict:
    name = state.model_name
    return {"object": "list", "data": [{
        "id": name, "object": "model", "created": state.created, "owned_by": "lab",
        "root": state.model_root or name, "max_model_len": state.async_llm.max_model_len}]}
