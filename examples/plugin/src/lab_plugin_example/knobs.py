"""The plug-in's knobs, declared the way lab declares its own (lab/config/knob.py): one field
each, and `python run.py background_chunk_tokens=32` / `LLM(..., background_chunk_tokens=32)`
set it; `lab knobs` lists it. Its options read it in their YAML as `${background_chunk_tokens}`."""

from __future__ import annotations

from dataclasses import dataclass

from lab.config.knob import knob


@dataclass(frozen=True)
class ExampleKnobs:
    background_chunk_tokens: int = knob(
        64, "scheduler=las: the most tokens a background request (priority > 0) gets in one "
        "step, so its prefill is chunked finely and foreground requests wait less", ge=1)
