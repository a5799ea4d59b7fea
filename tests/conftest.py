"""Shared test set-up: hypothesis profiles and the `gpu` marker's skip."""

import os

import pytest
from hypothesis import HealthCheck, settings

# `ci` (what scripts/test.sh runs) is sized to minutes on a 2-core CPU and derandomized, so a
# landing never depends on the draw; `dev` (plain pytest) draws new examples every run; `deep` is
# for long property runs by hand:
#   HYPOTHESIS_PROFILE=deep python -m pytest tests -m "not gpu"
settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "deep", max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
