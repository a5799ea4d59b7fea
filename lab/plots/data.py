"""Loading run directories for plots: the files a run writes, and a short label per run.

A run directory holds steps.jsonl, requests.jsonl, summary.json, config.yaml and, under Hydra,
.hydra/hydra.yaml (the chosen option of every group). A multirun sweep directory (numbered job
directories) stands for all of its jobs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab.config.compose import group_choices

REQUIRED = ("steps.jsonl", "requests.jsonl", "summary.json")


@dataclass
class RunData:
    path: Path
    steps: list[dict[str, Any]]
    requests: list[dict[str, Any]]
    summary: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)
    label: str = ""


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories among `paths`: each path itself, or the job directories under a sweep."""
    runs: list[Path] = []
    for p in map(Path, paths):
        if is_run_dir(p):
            runs.append(p)
            continue
        jobs = sorted((d for d in p.iterdir() if is_run_dir(d)), key=_job_order) \
            if p.is_dir() else []
        if not jobs:
            raise FileNotFoundError(f"{p} is not a run directory (no {', '.join(REQUIRED)}, "
                                    "or a failed run: its summary.json says why) nor a sweep "
                                    "directory holding run directories")
        runs.extend(jobs)
    return runs


def is_run_dir(p: Path) -> bool:
    """A finished run's directory (a failed one's summary.json says "status": "failed")."""
    return (p.is_dir() and all((p / name).is_file() for name in REQUIRED)
            and json.loads((p / "summary.json").read_text()).get("status") != "failed")


def _job_order(p: Path) -> tuple[int, str]:
    return (int(p.name), "") if p.name.isdigit() else (1 << 30, p.name)


def load_run(path: Path) -> RunData:
    """Read one run directory (config.yaml and .hydra/ are optional)."""
    path = Path(path)
    run = RunData(path, _jsonl(path / "steps.jsonl"), _jsonl(path / "requests.jsonl"),
                  json.loads((path / "summary.json").read_text()))
    if (path / "config.yaml").is_file():  # the resolved config + `choices` (run.py writes it)
        run.config = yaml.safe_load((path / "config.yaml").read_text()) or {}
        run.choices = {k: str(v) for k, v in (run.config.pop("choices", None) or {}).items()}
    hydra_file = path / ".hydra" / "hydra.yaml"
    if hydra_file.is_file():
        choices = (yaml.safe_load(hydra_file.read_text()) or {}).get("hydra", {}) \
            .get("runtime", {}).get("choices", {}) or {}
        run.choices.update(group_choices(choices))
    return run


def load_runs(paths: list[Path]) -> list[RunData]:
    """Every run under `paths`, labelled by what differs between them."""
    runs = [load_run(p) for p in find_runs(paths)]
    for run, label in zip(runs, run_labels(runs)):
        run.label = label
    return runs


def _jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_labels(runs: list[RunData], max_len: int = 48) -> list[str]:
    """'scheduler=sjf, workload.rate=20'-style labels from the settings (every run has) that
    differ; a run's directory name when nothing differs (or there is one run)."""
    descs = [_describe(r) for r in runs]
    keys = sorted(set.intersection(*(set(d) for d in descs))) if descs else []
    differing = [k for k in keys if len({repr(d.get(k)) for d in descs}) > 1]
    groups = {k for k in differing if "." not in k}  # a differing option hides its fields
    shown = [k for k in differing if k in groups or k.split(".", 1)[0] not in groups]
    labels = []
    for run, desc in zip(runs, descs):
        text = ", ".join(f"{k}={desc.get(k)}" for k in shown) or _dir_name(run.path)
        labels.append(text if len(text) <= max_len else text[: max_len - 1] + "…")
    return _unique(labels)


def _describe(run: RunData) -> dict[str, Any]:
    desc = _flatten(run.config)
    desc = {k: v for k, v in desc.items() if not k.endswith("_target_")}
    desc.update(run.choices)
    return desc


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _dir_name(p: Path) -> str:
    p = p.resolve()
    return f"{p.parent.name}/{p.name}" if p.name.isdigit() else p.name


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out
