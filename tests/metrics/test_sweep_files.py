"""experiments/sweeps/: every W&B sweep file drives run.py with Hydra overrides, every value of
every swept parameter composes with conf/, and its Hydra multirun equivalent is the same grid."""

import importlib.util
from pathlib import Path

import pytest
import yaml

from lab.config.compose import compose_config

SWEEPS = Path(__file__).resolve().parents[2] / "experiments" / "sweeps"
FILES = sorted(SWEEPS.glob("*.yaml"))


def _multirun():
    spec = importlib.util.spec_from_file_location("sweeps_multirun", SWEEPS / "multirun.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_sweep_file_composes(path):
    sweep = yaml.safe_load(path.read_text())
    cmd = sweep["command"]
    assert cmd[:3] == ["${env}", "${interpreter}", "run.py"] and cmd[-1] == "${args_no_hyphens}"
    fixed = cmd[3:-1]
    assert any(a.startswith("logger=") and "wandb" in a for a in fixed)
    params = {k: v["values"] for k, v in sweep["parameters"].items()}
    for key, values in params.items():
        for value in values:  # each value once, the other parameters at their first value
            point = {k: vs[0] for k, vs in params.items()} | {key: value}
            cfg = compose_config(fixed + [f"{k}={v}" for k, v in point.items()])
            assert "wandb" in cfg.logger
    overrides = _multirun().multirun_overrides(sweep)
    assert overrides == fixed + [f"{k}={','.join(map(str, vs))}" for k, vs in params.items()]


def test_multirun_refuses_non_grid():
    with pytest.raises(ValueError, match="grid"):
        _multirun().multirun_overrides({"method": "bayes", "parameters": {}})
