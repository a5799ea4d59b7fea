"""TraceWorkload: replay a recorded request trace, one request per row of a JSONL or CSV file.

    python run.py workload=trace                                   # the example trace below
    python run.py executor=sim workload=trace workload.path=my_trace.csv workload.time_scale=2

A row (a JSON object per line of a `.jsonl` / `.json` file, or a row under the header of a `.csv`
file) is one request; keys other than these are ignored, so a trace may carry its own columns:

| field | required | meaning |
|---|---|---|
| `arrival_time` or `timestamp` | one of them, the same one in every row | seconds from the trace's start, or absolute seconds (offset so that the first request arrives at 0) |
| `prompt_len` or `prompt_token_ids` | one of them (both: they must agree) | the prompt's length (ids drawn with the seeded `TokenSampler`, avoiding special tokens as the synthetic workload does), or the ids themselves (a JSON list, JSONL only) |
| `output_len` | yes | the request's `max_tokens`; with `ignore_eos` every output has exactly this length (under `executor=sim` always: its outputs end at `max_tokens`) |
| `priority` | no (0) | an integer; lower is served first under `scheduler=priority` |
| `client_id` | no (none) | a string; `scheduler=fair` shares the engine between clients |
| `request_id` | no (the row number) | a string (or a JSON integer), unique in the file |

Rows may come in any order: they are sorted stably by arrival. `columns` maps these names to a
trace's own: `{arrival_time: arrived_at, prompt_len: num_prefill_tokens, output_len:
num_decode_tokens}` reads Vidur's trace CSVs. In a CSV an empty cell is a missing value, in JSON
`null` is. A bad row is refused with a ValueError naming the file, the row (1-based among the
data rows, with the file's line), the field and what is allowed.

`python -m lab.workloads.trace write OUT.jsonl` writes a trace from a seeded generator (gamma
arrivals, lognormal lengths, a few priorities and clients); `python -m lab.workloads.trace stats
FILE` describes a trace (see `trace_stats`). The example trace shipped with lab,
`lab/workloads/traces/example.jsonl` (the `workload=trace` default), was written so:
lab/conf/workload/trace.yaml has its command and its statistics.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from lab.core.sampling_params import SamplingParams
from lab.workloads.base import Workload, WorkloadRequest
from lab.workloads.distributions import (
    LengthDist,
    TokenSampler,
    arrival_times,
    check_int,
    is_int,
    is_num,
    to_plain,
    validate_arrival,
)

log = logging.getLogger(__name__)

EXAMPLE_TRACE = Path(__file__).resolve().parent / "traces" / "example.jsonl"
JSON_SUFFIXES = (".jsonl", ".json")
CSV_SUFFIXES = (".csv",)
FIELDS = ("arrival_time", "timestamp", "prompt_len", "prompt_token_ids", "output_len",
          "priority", "client_id", "request_id")
INTERPRETER_HINT = 32  # more rows than this under Triton's interpreter: warn that it is slow


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace, as read (before time_scale, num_requests and the clamps)."""

    row: int  # 1-based among the data rows, in file order
    line: int  # the file's line (a CSV's header is line 1)
    arrival: float  # seconds from the trace's start (timestamps are offset by the first)
    prompt_len: int
    prompt_token_ids: list[int] | None
    output_len: int
    priority: int = 0
    client_id: str | None = None
    request_id: str = ""


@dataclass(frozen=True)
class Trace:
    """A trace file's rows, sorted stably by arrival."""

    path: Path
    rows: list[TraceRow]
    arrival_field: str  # "arrival_time" or "timestamp": the one the rows give


class TraceWorkload(Workload):
    """Requests read from a trace file; every knob is a plain (Hydra-overridable) argument.

    `path`: the trace (None: the example trace shipped with lab). `num_requests`: the first N
    rows by arrival (None: all). `time_scale`: arrivals are divided by it (2.0 replays twice as
    fast; 1000 reads a trace written in milliseconds as seconds). `columns`: {field: the
    trace's column name}. `max_prompt_len` / `max_output_len`: longer rows are clamped (a prompt
    given as ids keeps its first ids), e.g. to replay a production trace on a model with a short
    context; None: as traced. `seed` draws the ids of `prompt_len` rows: a row gets the same ids
    whatever `time_scale`, and the first N rows the same ids whatever `num_requests`.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        num_requests: int | None = None,
        time_scale: float = 1.0,
        columns: Mapping[str, str] | None = None,
        max_prompt_len: int | None = None,
        max_output_len: int | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        ignore_eos: bool = True,
        low_token_id: int = 3,
        seed: int = 0,
    ) -> None:
        if num_requests is not None:
            check_int("num_requests", num_requests, 1)
        if not (is_num(time_scale) and 0 < time_scale < math.inf):
            raise ValueError(f"time_scale={time_scale!r} must be a finite number > 0 "
                             "(arrivals are divided by it: 2.0 replays twice as fast)")
        for name, value in [("max_prompt_len", max_prompt_len),
                            ("max_output_len", max_output_len)]:
            if value is not None:
                check_int(name, value, 1)
        check_int("low_token_id", low_token_id, 0)
        check_int("seed", seed, 0)
        self.sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k,
                         "ignore_eos": ignore_eos}
        SamplingParams(**self.sampling, max_tokens=1)  # validates early
        self.num_requests, self.time_scale = num_requests, time_scale
        self.max_prompt_len, self.max_output_len = max_prompt_len, max_output_len
        self.low_token_id, self.seed = low_token_id, seed
        self.trace = read_trace(EXAMPLE_TRACE if path is None else path, columns)
        self.path = self.trace.path
        if num_requests is not None and num_requests > len(self.trace.rows):
            raise ValueError(f"num_requests={num_requests} is more than the "
                             f"{len(self.trace.rows)} rows of {self.path} (null: all of them)")

    def requests(
        self, vocab_size: int, eos_token_id: int | None, interpreted: bool = False
    ) -> list[WorkloadRequest]:
        rows = self.trace.rows[: self.num_requests]
        if interpreted and self.num_requests is None and len(rows) > INTERPRETER_HINT:
            log.warning("replaying all %d rows of %s in Triton's interpreter (no CUDA) is slow; "
                        "workload.num_requests=%d replays the first ones", len(rows), self.path,
                        INTERPRETER_HINT)
        sampler = None
        if any(r.prompt_token_ids is None for r in rows):
            sampler = TokenSampler(vocab_size, eos_token_id, self.low_token_id)
        rng = np.random.default_rng(self.seed)
        out = []
        for r in rows:
            if r.prompt_token_ids is not None:
                _check_ids(self.path, r, vocab_size)
                prompt = r.prompt_token_ids[: self.max_prompt_len]
            else:
                prompt = sampler.draw(rng, _clamp(r.prompt_len, self.max_prompt_len))
            max_tokens = _clamp(r.output_len, self.max_output_len)
            out.append(WorkloadRequest(
                prompt_token_ids=prompt,
                sampling_params=SamplingParams(**self.sampling, max_tokens=max_tokens),
                arrival_time=r.arrival / self.time_scale,
                priority=r.priority,
                client_id=r.client_id,
                request_id=r.request_id,
            ))
        return out  # the trace's rows are sorted by arrival


def _clamp(n: int, cap: int | None) -> int:
    return n if cap is None else min(n, cap)


def _check_ids(path: Path, r: TraceRow, vocab_size: int) -> None:
    for i, t in enumerate(r.prompt_token_ids):
        if t >= vocab_size:
            raise ValueError(f"{_where(path, r.row, r.line)}: prompt_token_ids[{i}]={t} is not a "
                             f"token id of this model: allowed 0 <= id < vocab_size={vocab_size}")


# --- reading ---------------------------------------------------------------------------------


def read_trace(path: str | Path, columns: Mapping[str, str] | None = None) -> Trace:
    """Read and check every row of a trace file (see the module docstring for the format)."""
    path = Path(path)
    columns = _check_columns(to_plain(columns) or {})
    if not path.is_file():
        raise FileNotFoundError(f"workload.path={str(path)!r}: no such file (a trace: .jsonl, "
                                ".json or .csv; null: lab's example trace)")
    suffix = path.suffix.lower()
    if suffix in JSON_SUFFIXES:
        raw_rows = _json_rows(path)
    elif suffix in CSV_SUFFIXES:
        raw_rows = _csv_rows(path, columns)
    else:
        raise ValueError(f"{path}: unknown suffix {path.suffix!r}: allowed .jsonl or .json (one "
                         "JSON object per line) and .csv (a header row, then one row per request)")
    parser = _RowParser(path, columns, is_csv=suffix in CSV_SUFFIXES)
    rows = [parser.parse(i, line, raw) for i, (line, raw) in enumerate(raw_rows, 1)]
    if not rows:
        raise ValueError(f"{path}: the trace has no rows: one request per "
                         f"{'row under the header' if suffix in CSV_SUFFIXES else 'line'}")
    _check_unique_ids(path, rows)
    rows.sort(key=lambda r: r.arrival)  # stable: ties keep file order
    if parser.arrival_field == "timestamp":
        t0 = rows[0].arrival
        rows = [replace(r, arrival=r.arrival - t0) for r in rows]
    return Trace(path, rows, parser.arrival_field)


def _json_rows(path: Path) -> Iterator[tuple[int, Any]]:
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                yield line, json.loads(text)
            except json.JSONDecodeError as e:
                hint = (" (a JSON array is not read: write one object per line)"
                        if text.lstrip().startswith("[") else "")
                raise ValueError(f"{path}: line {line}: not a JSON object: {e}{hint}") from None


def _csv_rows(path: Path, columns: Mapping[str, str]) -> Iterator[tuple[int, Any]]:
    with open(path, encoding="utf-8-sig", newline="") as f:  # -sig: a spreadsheet's BOM
        reader = csv.DictReader(f)
        header = reader.fieldnames
        if not header:
            raise ValueError(f"{path}: the trace is empty: a CSV trace starts with a header row "
                             "(arrival_time or timestamp, prompt_len, output_len, ...)")
        col = {name: columns.get(name, name) for name in FIELDS}
        missing = [col[n] for n in ("prompt_len", "output_len") if col[n] not in header]
        if col["arrival_time"] not in header and col["timestamp"] not in header:
            missing.insert(0, f"{col['arrival_time']} or {col['timestamp']}")
        if missing:
            raise ValueError(f"{path}: line 1 (the header): no column {', '.join(missing)}: "
                             f"required (the header has {', '.join(header)})")
        for raw in reader:
            yield reader.line_num, raw


class _RowParser:
    """Checks one raw row (a JSON object or a CSV row's dict) into a TraceRow."""

    def __init__(self, path: Path, columns: Mapping[str, str], is_csv: bool) -> None:
        self.path, self.columns, self.is_csv = path, columns, is_csv
        self.arrival_field: str | None = None  # decided by the first row
        self.first_row = 0
        self.where, self.raw = "", {}  # the row being parsed

    def parse(self, row: int, line: int, raw: Any) -> TraceRow:
        self.where = _where(self.path, row, line)
        if not isinstance(raw, dict):
            raise ValueError(f"{self.where}: {raw!r} is not a JSON object: one object per line, "
                             'e.g. {"arrival_time": 0.5, "prompt_len": 64, "output_len": 16}')
        if None in raw:  # csv.DictReader's key for cells past the header
            raise ValueError(f"{self.where}: {len(raw[None])} more cell(s) than the header's "
                             f"{len(raw) - 1} columns")
        self.raw = raw
        arrival = self._arrival(row)
        ids = self._ids()
        prompt_len = self._count("prompt_len", required=ids is None)
        if ids is not None and prompt_len is not None and prompt_len != len(ids):
            raise ValueError(f"{self.where}: {self._label('prompt_len')}={prompt_len} but "
                             f"{self._label('prompt_token_ids')} has {len(ids)} ids: give one "
                             "of them, or both agreeing")
        priority = self._integer("priority")
        return TraceRow(
            row=row, line=line, arrival=arrival,
            prompt_len=len(ids) if ids is not None else prompt_len,
            prompt_token_ids=ids,
            output_len=self._count("output_len", required=True),
            priority=0 if priority is None else priority,
            client_id=self._string("client_id", ints=False),
            request_id=self._string("request_id", ints=True) or str(row),
        )

    def _label(self, field: str) -> str:
        col = self.columns.get(field, field)
        return field if col == field else f"{col} (workload field {field})"

    def _get(self, field: str) -> Any:
        value = self.raw.get(self.columns.get(field, field))
        return None if value is None or (self.is_csv and value.strip() == "") else value

    def _fail(self, field: str, value: Any, allowed: str) -> ValueError:
        return ValueError(f"{self.where}: {self._label(field)}={value!r} is invalid: {allowed}")

    def _arrival(self, row: int) -> float:
        given = [f for f in ("arrival_time", "timestamp") if self._get(f) is not None]
        if not given:
            raise ValueError(
                f"{self.where}: missing {self._label('arrival_time')} or "
                f"{self._label('timestamp')}: one is required (seconds from the trace's start, "
                "or absolute seconds)")
        if len(given) == 2:
            raise ValueError(f"{self.where}: both {self._label('arrival_time')} and "
                             f"{self._label('timestamp')}: give one of them")
        field = given[0]
        if self.arrival_field is None:
            self.arrival_field, self.first_row = field, row
        elif field != self.arrival_field:
            raise ValueError(f"{self.where}: {self._label(field)} but row {self.first_row} "
                             f"gives {self._label(self.arrival_field)}: every row gives the same")
        allowed = ("must be a number of seconds >= 0 from the trace's start"
                   if field == "arrival_time" else "must be a number of seconds")
        value = self._get(field)
        x = self._number(field, value, allowed)
        if field == "arrival_time" and x < 0:
            raise self._fail(field, value, allowed)
        return x

    def _number(self, field: str, value: Any, allowed: str) -> float:
        if isinstance(value, str):
            try:
                x = float(value)
            except ValueError:
                raise self._fail(field, value, f"not a number: {allowed}") from None
        elif isinstance(value, int | float) and not isinstance(value, bool):
            x = float(value)
        else:
            raise self._fail(field, value, f"not a number: {allowed}")
        if not math.isfinite(x):
            raise self._fail(field, value, allowed)
        return x

    def _integral(self, field: str, value: Any, allowed: str) -> int:
        if is_int(value):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        x = self._number(field, value, allowed)
        if not x.is_integer():
            raise self._fail(field, value, f"not an integer: {allowed}")
        return int(x)

    def _count(self, field: str, required: bool) -> int | None:
        value = self._get(field)
        if value is None:
            if required:
                raise ValueError(f"{self.where}: missing {self._label(field)}: required, an "
                                 "integer >= 1 (tokens)")
            return None
        n = self._integral(field, value, "must be an integer >= 1 (tokens)")
        if n < 1:
            raise self._fail(field, value, "must be an integer >= 1 (tokens)")
        return n

    def _integer(self, field: str) -> int | None:
        value = self._get(field)
        if value is None:
            return None
        return self._integral(field, value, "must be an integer (lower is served first)")

    def _string(self, field: str, ints: bool) -> str | None:
        value = self._get(field)
        if value is None or isinstance(value, str):
            return value
        if ints and is_int(value):
            return str(value)
        raise self._fail(field, value, "must be a string" + (" or an integer" if ints else ""))

    def _ids(self) -> list[int] | None:
        value = self._get("prompt_token_ids")
        if value is None:
            return None
        if self.is_csv:
            raise self._fail("prompt_token_ids", value, "token ids are read from JSONL traces "
                             "only; a CSV trace gives prompt_len")
        allowed = "must be a non-empty list of token ids (integers >= 0)"
        if not isinstance(value, list) or not value:
            raise self._fail("prompt_token_ids", value, allowed)
        for i, t in enumerate(value):
            if not (is_int(t) and t >= 0):
                raise ValueError(f"{self.where}: {self._label('prompt_token_ids')}[{i}]={t!r} "
                                 f"is invalid: {allowed}")
        return value


def _where(path: Path, row: int, line: int) -> str:
    return f"{path}: row {row} (line {line})"


def _check_unique_ids(path: Path, rows: Sequence[TraceRow]) -> None:
    seen: dict[str, TraceRow] = {}
    for r in rows:
        if r.request_id in seen:
            raise ValueError(
                f"{_where(path, r.row, r.line)}: request_id={r.request_id!r} is already the id "
                f"of row {seen[r.request_id].row}: ids must be unique (a row without one gets "
                "its row number)")
        seen[r.request_id] = r


def _check_columns(columns: Any) -> dict[str, str]:
    if not isinstance(columns, Mapping):
        raise ValueError(f"columns={columns!r} must be a mapping {{field: the trace's column}}")
    for key, value in columns.items():
        if key not in FIELDS:
            raise ValueError(f"columns.{key} is not a trace field (allowed: {', '.join(FIELDS)})")
        if not (isinstance(value, str) and value):
            raise ValueError(f"columns.{key}={value!r} must be a column name (a string)")
    return dict(columns)




# --- writing and describing traces -----------------------------------------------------------

PROMPT_LEN = LengthDist(dist="lognormal", min=16, max=384, mean=96, std=64, name="prompt_len")
OUTPUT_LEN = LengthDist(dist="lognormal", min=8, max=128, mean=40, std=24, name="output_len")


def write_trace(
    path: str | Path,
    num_requests: int = 200,
    rate: float = 8.0,
    burstiness: float = 0.5,
    prompt_len: LengthDist = PROMPT_LEN,
    output_len: LengthDist = OUTPUT_LEN,
    num_priorities: int = 3,
    num_clients: int = 4,
    seed: int = 0,
) -> Path:
    """Write a trace (JSONL, or CSV by the suffix) from a seeded generator: gamma arrivals at
    `rate` requests/s (`burstiness` = the gamma shape: 1 is Poisson, < 1 burstier), lognormal
    prompt and output lengths clipped to their [min, max], priorities uniform in
    [0, num_priorities), client ids `client{k}` uniform over `num_clients` (0: none). Arrivals
    are rounded to microseconds. Deterministic given the arguments: the same bytes every time."""
    path = Path(path)
    check_int("num_requests", num_requests, 1)
    validate_arrival("gamma", rate, burstiness)
    prompt_len.validate()
    output_len.validate()
    check_int("num_priorities", num_priorities, 1)
    check_int("num_clients", num_clients, 0)
    check_int("seed", seed, 0)
    suffix = path.suffix.lower()
    if suffix not in JSON_SUFFIXES + CSV_SUFFIXES:
        raise ValueError(f"{path}: unknown suffix {path.suffix!r}: allowed .jsonl, .json, .csv")
    arr_rng, len_rng, pri_rng, cli_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4))
    arrivals = arrival_times("gamma", num_requests, rate, burstiness, arr_rng)
    prompts = prompt_len.sample(len_rng, num_requests)
    outputs = output_len.sample(len_rng, num_requests)
    priorities = pri_rng.integers(0, num_priorities, size=num_requests)
    clients = cli_rng.integers(0, max(num_clients, 1), size=num_requests)
    rows = []
    for i in range(num_requests):
        row = {"arrival_time": round(float(arrivals[i]), 6), "prompt_len": int(prompts[i]),
               "output_len": int(outputs[i]), "priority": int(priorities[i])}
        if num_clients:
            row["client_id"] = f"client{clients[i]}"
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        if suffix in CSV_SUFFIXES:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        else:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return path


def trace_stats(path: str | Path, columns: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What `stats` prints, as read (before time_scale, num_requests and clamps):

    requests; duration (s, first to last arrival); mean rate ((requests - 1) / duration,
    requests/s: the gaps' mean rate, None when every request arrives at once); prompt_len and
    output_len mean, p50, p90 (numpy's linear-interpolated percentiles) and max (tokens);
    priorities ({priority: requests}); clients (distinct client ids, 0 when none is given)."""
    rows = read_trace(path, columns).rows
    duration = rows[-1].arrival - rows[0].arrival

    def describe(xs: list[int]) -> dict[str, float]:
        a = np.asarray(xs, dtype=np.float64)
        return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
                "p90": float(np.percentile(a, 90)), "max": float(a.max())}

    return {
        "requests": len(rows),
        "duration": duration,
        "mean_rate": (len(rows) - 1) / duration if duration > 0 else None,
        "prompt_len": describe([r.prompt_len for r in rows]),
        "output_len": describe([r.output_len for r in rows]),
        "priorities": dict(sorted(Counter(r.priority for r in rows).items())),
        "clients": len({r.client_id for r in rows if r.client_id is not None}),
    }


def format_stats(stats: Mapping[str, Any]) -> str:
    rate = stats["mean_rate"]
    lines = [
        f"requests:   {stats['requests']}",
        f"duration:   {stats['duration']:.2f} s (first to last arrival)",
        f"mean rate:  {'all at once' if rate is None else f'{rate:.2f} req/s'}",
    ]
    for name in ("prompt_len", "output_len"):
        d = stats[name]
        lines.append(f"{name + ':':<11} mean {d['mean']:.1f}  p50 {d['p50']:.1f}  "
                     f"p90 {d['p90']:.1f}  max {d['max']:.0f}")
    lines.append("priorities: " + ", ".join(f"{p}: {n}" for p, n in stats["priorities"].items()))
    lines.append(f"clients:    {stats['clients']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lab.workloads.trace",
                                description="Write a seeded synthetic trace, or describe one.")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write a trace (JSONL, or CSV by the suffix)")
    w.add_argument("out", type=Path)
    w.add_argument("--num-requests", type=int, default=200)
    w.add_argument("--rate", type=float, default=8.0, help="mean requests/s")
    w.add_argument("--burstiness", type=float, default=0.5,
                   help="the gamma shape of the gaps: 1 = Poisson, < 1 burstier")
    for name, d in [("prompt", PROMPT_LEN), ("output", OUTPUT_LEN)]:
        w.add_argument(f"--{name}-mean", type=float, default=d.mean,
                       help=f"lognormal mean of the {name} lengths (tokens)")
        w.add_argument(f"--{name}-std", type=float, default=d.std)
        w.add_argument(f"--{name}-min", type=int, default=d.min, help="clip below")
        w.add_argument(f"--{name}-max", type=int, default=d.max, help="clip above")
    w.add_argument("--num-priorities", type=int, default=3)
    w.add_argument("--num-clients", type=int, default=4)
    w.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("stats", help="describe a trace (see trace_stats)")
    s.add_argument("path", type=Path)
    args = p.parse_args(argv)
    try:
        if args.command == "stats":
            print(format_stats(trace_stats(args.path)))
            return
        lengths = {
            name: replace(d, mean=getattr(args, f"{name}_mean"), std=getattr(args, f"{name}_std"),
                          min=getattr(args, f"{name}_min"), max=getattr(args, f"{name}_max"))
            for name, d in [("prompt", PROMPT_LEN), ("output", OUTPUT_LEN)]}
        out = write_trace(args.out, args.num_requests, args.rate, args.burstiness,
                          lengths["prompt"], lengths["output"], args.num_priorities,
                          args.num_clients, args.seed)
    except (ValueError, FileNotFoundError) as e:
        p.exit(2, f"{p.prog} {args.command}: {e}\n")
    print(f"wrote {args.num_requests} requests to {out}")


if __name__ == "__main__":
    main()
