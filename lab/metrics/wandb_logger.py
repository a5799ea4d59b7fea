"""WandbLogger: one Weights & Biases run per job, per-step scheduler / KV curves, latencies.

    python run.py logger=[console,jsonl,wandb]                      # offline unless logged in
    python run.py logger=[console,jsonl,wandb] logger.wandb.project=my-study

The run: `config` = the resolved Hydra config; tags = the chosen option of every config group
(`attention:torch`, `scheduler:fcfs`, ...); its files under `<hydra job dir>/wandb/`; in a Hydra
multirun the jobs of one sweep share a `group` and are named by their overrides.

History (x axis `engine/step`, declared with `define_metric`):
    engine/step, engine/time               the last step of the point and its end (s since start)
    sched/<StepStats field>                queue sizes, scheduled / prefill / decode tokens,
                                           preemptions (sched/preempted_by_strategy/<name>), ...
    kv/<StepStats field>                   kv_cache_usage, kv_blocks_used, prefix-cache queries /
                                           hits, evictions, swap blocks and bytes
Decimation: a point covers a window of `log_every_steps` steps; each time `decimate_after` points
have been logged at the current window length, the window doubles (null: never). Counters are
summed over the window; queue sizes, KV usage and blocks are the window's last step. So a short
run is logged step by step and a run of S >> decimate_after steps logs about
decimate_after * log2(S / decimate_after) points. The exact per-step trace is steps.jsonl.

At close: a `requests` table (one row per finished request), histograms `latency/ttft_s`,
`latency/tpot_s`, `latency/itl_s`, `latency/e2e_s`, and every RunSummary field in the run
summary (output / request throughput, goodput under the config's SLOs, latency percentiles,
preemptions, prefix-cache hit rate, peak KV usage, ...).

Mode `auto`: $WANDB_MODE if set, else online when credentials are configured ($WANDB_API_KEY or
a netrc entry for the W&B host), else offline; offline runs print the `wandb sync` command.
wandb is imported only when this logger starts a run.
"""

from __future__ import annotations

import itertools
import logging
import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lab.config.compose import hydra_choices
from lab.core.stats import RequestStats, StepStats
from lab.metrics.base import StatLogger
from lab.metrics.stats import RunSummary

log = logging.getLogger(__name__)

STEP_METRIC = "engine/step"
# StepStats fields that are states (the window's last value); every other number is a count.
GAUGES = frozenset({"step", "time", "num_running_reqs", "num_waiting_reqs", "num_swapped_reqs",
                    "kv_cache_usage", "kv_blocks_used", "kv_blocks_total"})
# step fields that are a list of counts (summed when steps merge): per draft position
COUNT_LISTS = frozenset({"accepted_per_position"})
KV_FIELDS = frozenset({"kv_cache_usage", "kv_blocks_used", "kv_blocks_total",
                       "prefix_cache_queries", "prefix_cache_hits", "num_evicted_blocks",
                       "swap_out_blocks", "swap_in_blocks", "swap_out_bytes", "swap_in_bytes",
                       "num_swap_fallbacks", "kv_blocks_used_per_group",
                       "num_window_freed_blocks"})
LATENCIES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2e_latency"}


class StepDecimator:
    """Merges consecutive StepStats records into windows that double in length over time."""

    def __init__(self, log_every_steps: int = 1, decimate_after: int | None = None) -> None:
        if not isinstance(log_every_steps, int) or log_every_steps < 1:
            raise ValueError(f"log_every_steps={log_every_steps!r} must be an integer >= 1")
        if decimate_after is not None and (not isinstance(decimate_after, int)
                                           or decimate_after < 1):
            raise ValueError(f"decimate_after={decimate_after!r} must be an integer >= 1 or null")
        self.window = log_every_steps
        self.decimate_after = decimate_after
        self._points_at_window = 0
        self._acc: dict[str, Any] | None = None
        self._count = 0

    def add(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Add one step's record (StepStats.to_dict()); return a merged point when one is full."""
        self._acc = record if self._acc is None else merge_steps(self._acc, record)
        self._count += 1
        if self._count < self.window:
            return None
        point = self.flush()
        self._points_at_window += 1
        if self.decimate_after is not None and self._points_at_window >= self.decimate_after:
            self.window *= 2
            self._points_at_window = 0
        return point

    def flush(self) -> dict[str, Any] | None:
        """The partial window, if any (at the end of the run)."""
        point, self._acc, self._count = self._acc, None, 0
        return point


def merge_steps(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two consecutive step records as one: gauges from `b`, counts summed (dicts per key)."""
    out = dict(b)
    for key, value in b.items():
        if key in GAUGES:
            continue
        if isinstance(value, dict):
            merged = dict(a.get(key) or {})
            for k, v in value.items():
                merged[k] = merged.get(k, 0) + v
            out[key] = merged
        elif isinstance(value, int | float):
            out[key] = a.get(key, 0) + value
        elif key in COUNT_LISTS:  # counts per position: summed position by position
            before = a.get(key) or []
            out[key] = [x + y for x, y in itertools.zip_longest(before, value, fillvalue=0)]
    return out


def wandb_step_record(record: dict[str, Any]) -> dict[str, float]:
    """A step record (StepStats.to_dict(), maybe merged) under its W&B names."""
    out: dict[str, float] = {STEP_METRIC: record["step"], "engine/time": record["time"]}
    for key, value in record.items():
        if key in ("step", "time"):
            continue
        section = "kv" if key in KV_FIELDS else "sched"
        if isinstance(value, dict):
            for k, v in value.items():
                out[f"{section}/{key}/{k}"] = v
        elif key == "kv_blocks_used_per_group":  # a state per KV cache group: the last step's
            for group, v in enumerate(value):
                out[f"{section}/{key}/{group}"] = v
        elif key in COUNT_LISTS:
            for position, v in enumerate(value):
                out[f"spec/{key}/{position}"] = v
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[f"{section}/{key}"] = value
    return out


def request_row(r: RequestStats) -> dict[str, Any]:
    """A finished request as a flat table row: `itl` (a list) becomes itl_mean / itl_max."""
    row = r.to_dict()
    itl = row.pop("itl")
    row["itl_mean"] = sum(itl) / len(itl) if itl else None
    row["itl_max"] = max(itl) if itl else None
    return row


def choice_tags(choices: Mapping[str, str]) -> list[str]:
    """`group:option` tags (W&B caps a tag at 64 characters)."""
    return [f"{group}:{option}"[:64] for group, option in sorted(choices.items())]


def hydra_run_names() -> tuple[str | None, str | None]:
    """(group, name) of a Hydra multirun job: the sweep dir, and the job's values of the swept
    keys (`scheduler=sjf,workload.rate=20`); (None, None) otherwise (W&B picks a name)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None, None
    hc = HydraConfig.get()
    swept = swept_keys(Path(hc.sweep.dir) / "multirun.yaml")
    task = list(hc.overrides.task)
    chosen = [o for o, key in zip(task, _override_keys(task)) if key in swept]
    return str(hc.sweep.dir), ",".join(chosen) or hc.job.override_dirname or None


def swept_keys(multirun_yaml: Path) -> set[str]:
    """The keys a multirun sweeps over (`a=1,2`, `range(...)`, ...), from its multirun.yaml."""
    import yaml

    try:
        task = yaml.safe_load(multirun_yaml.read_text())["hydra"]["overrides"]["task"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return set()
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(task))
    return {o.get_key_element() for o in parsed if o.is_sweep_override()}


def _override_keys(overrides: list[str]) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return [o.get_key_element() for o in OverridesParser.create().parse_overrides(overrides)]


def has_wandb_credentials(env: Mapping[str, str] | None = None) -> bool:
    """True when an API key is configured: $WANDB_API_KEY, or a netrc entry for the W&B host."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = env.get("NETRC") or str(Path.home() / ".netrc")
    try:
        return netrc.netrc(path).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode(mode: str, env: Mapping[str, str] | None = None) -> str:
    """`auto` -> $WANDB_MODE, else online with credentials, else offline; others unchanged."""
    if mode not in ("auto", "online", "offline", "disabled"):
        raise ValueError(f"WandbLogger.mode={mode!r}: use auto, online, offline or disabled")
    if mode != "auto":
        return mode
    env = os.environ if env is None else env
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"]
    return "online" if has_wandb_credentials(env) else "offline"


class WandbLogger(StatLogger):
    """Streams step statistics to a W&B run; latencies and the summary at close."""

    def __init__(
        self, project: str = "lab", entity: str | None = None, group: str | None = None,
        name: str | None = None, tags: list[str] | None = None, mode: str = "auto",
        log_every_steps: int = 1, decimate_after: int | None = 1000,
        request_table: bool = True, histograms: bool = True, console: str = "auto",
        choices: dict[str, str] | None = None,
    ) -> None:
        resolve_mode(mode, {})  # validate now
        self.decimator = StepDecimator(log_every_steps, decimate_after)
        self.init_kwargs = {"project": project, "entity": entity, "group": group, "name": name}
        self.extra_tags = list(tags or [])
        self.mode = mode
        self.request_table, self.histograms, self.console = request_table, histograms, console
        self.choices = choices  # None: the running Hydra job's choices
        self.run_dir: Path | None = None
        self.run = None
        self.requests: list[RequestStats] = []

    def on_start(self, run_dir: Path, config=None, total_requests=None) -> None:
        super().on_start(run_dir, config, total_requests)
        import wandb

        self.run_dir.mkdir(parents=True, exist_ok=True)
        choices = self.choices if self.choices is not None else hydra_choices()
        group, name = hydra_run_names()
        kwargs = dict(self.init_kwargs)
        kwargs["group"] = kwargs["group"] or group
        kwargs["name"] = kwargs["name"] or name
        self.run = wandb.init(
            **kwargs, config=dict(config or {}), tags=choice_tags(choices) + self.extra_tags,
            dir=str(self.run_dir), mode=resolve_mode(self.mode),
            settings=wandb.Settings(console=self.console),
        )
        self.run.define_metric(STEP_METRIC)
        for section in ("engine", "sched", "kv"):
            self.run.define_metric(f"{section}/*", step_metric=STEP_METRIC)
        self.run.define_metric("kv/kv_cache_usage", step_metric=STEP_METRIC, summary="max")

    def on_step(self, stats: StepStats) -> None:
        point = self.decimator.add(stats.to_dict())
        if point is not None:
            self._log_point(point)

    def on_request(self, stats: RequestStats) -> None:
        self.requests.append(stats)

    def close(self, summary: RunSummary) -> None:
        if self.run is None:
            raise RuntimeError("WandbLogger.close() called before on_start()")
        point = self.decimator.flush()
        if point is not None:
            self._log_point(point)
        self._log_requests()
        self.run.summary.update(summary.to_dict())
        offline = self.run.offline
        sync_dir = self.run.settings.sync_dir
        self.run.finish()
        self.run = None
        if offline:
            print(f"wandb: offline run saved; upload it with:  wandb sync {sync_dir}", flush=True)

    def _log_point(self, point: dict[str, Any]) -> None:
        self.run.log(wandb_step_record(point))

    def _log_requests(self) -> None:
        import wandb

        data: dict[str, Any] = {}
        if self.request_table and self.requests:
            rows = [request_row(r) for r in self.requests]
            columns = list(rows[0])
            data["requests"] = wandb.Table(columns=columns,
                                           data=[[row[c] for c in columns] for row in rows])
        if self.histograms:
            for name, values in latency_values(self.requests).items():
                if values:
                    data[f"latency/{name}_s"] = wandb.Histogram(values)
        if data:
            self.run.log(data)


def latency_values(requests: list[RequestStats]) -> dict[str, list[float]]:
    """TTFT / TPOT / ITL / E2E samples in seconds (ITL pools every request's gaps)."""
    out: dict[str, list[float]] = {}
    for name, field_name in LATENCIES.items():
        if name == "itl":
            out[name] = [x for r in requests for x in r.itl]
        else:
            out[name] = [v for r in requests if (v := getattr(r, field_name)) is not None]
    return out
