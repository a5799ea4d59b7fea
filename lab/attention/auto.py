"""`attention=auto` (the default): the fastest correct backend for the device and the model.

    python run.py                        # attention=auto
    python run.py attention=torch        # a named backend instead (torch, cpu, triton_flash, ...)

The choice (`choose_backend`, the policy; nothing else here):

    a CPU                        attention=cpu: decode steps and fresh prefills on its own paths
                                 (the C++ paged-decode kernel), everything else attention=torch's;
                                 where the kernel cannot be built, torch's path with one warning
    CUDA, a model with MLA       attention=triton_mla
    CUDA, any other model        attention=triton_flash (every per-layer feature)

On a CPU attention=cpu is the faster of the backends that run there at speed (the Triton ones run
in Triton's interpreter; the README's performance section has the measurements). The option is a partial that
the worker completes once it knows its device and the model (`build_backend`), before the model
loads; the summary's header names the backend it chose.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from hydra.utils import get_object, instantiate

from lab.attention.base import AttentionBackend

#: what auto may choose, by where it runs: (CPU, CUDA, CUDA with MLA)
CHOICES = ("lab.attention.cpu_backend.CPUAttentionBackend",
           "lab.attention.triton_flash.TritonFlashBackend",
           "lab.attention.triton_mla.TritonMLABackend")


def choose_backend(device: torch.device, mla: bool) -> str:
    """The class (its import path) attention=auto runs on `device` for a model that has (or
    has not) MLA layers."""
    cpu, flash, mla_backend = CHOICES
    if torch.device(device).type != "cuda":
        return cpu
    return mla_backend if mla else flash


def chooses(*classes: str):
    """Mark the function of a partial attention option (attention=auto's, or a plug-in's that
    chooses the same way) with the import paths of the backend classes it may build
    (`backend_choices`): config checks ask each of them (`backend_classes`)."""
    def mark(fn):
        fn.backend_choices = classes
        return fn
    return mark


@chooses(*CHOICES)
def auto_backend(*, device: torch.device, mla: bool) -> AttentionBackend:
    """attention=auto's backend on `device` for a model with (or without) MLA layers."""
    return get_object(choose_backend(device, mla))()


def build_backend(option: dict[str, Any], device: torch.device, hf_config) -> AttentionBackend:
    """The attention option's backend: a named option as configured; a partial option
    (attention=auto's, or a plug-in's that chooses the same way) completed with `device=` and
    `mla=` (whether the model has MLA layers)."""
    backend = instantiate(option)
    if isinstance(backend, functools.partial):
        backend = backend(device=device, mla=has_mla(hf_config))
    return backend


def has_mla(hf_config) -> bool:
    """Whether any of the model's attention layers is multi-head latent attention."""
    from lab.models.registry import arch_spec

    return any(s.kind == "mla" for s in arch_spec(hf_config).layer_attention_specs(hf_config))


def backend_classes(target: str) -> list[type[AttentionBackend]]:
    """The backend classes an attention option's `_target_` may build: itself, or every class
    a chooser marked with `chooses` may build (config checks ask each)."""
    obj = get_object(target)
    return [get_object(c) for c in getattr(obj, "backend_choices", ())] or [obj]
