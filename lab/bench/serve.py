"""Online serving benchmark: a client like `vllm bench serve` for ANY OpenAI-compatible server
(lab's server or `vllm serve`). It sends streaming completions at a chosen arrival rate and
reports throughput and latency (TTFT, TPOT, ITL, E2EL) and, optionally, goodput.

    python -m lab.bench.serve --base-url http://127.0.0.1:8001 --model NAME \\
        --num-prompts 16 --request-rate inf --input-len 32 --output-len 16 --tokenizer DIR
    python -m lab.bench.serve --base-url ... --model NAME --request-rate 4 --burstiness 0.5 \\
        --max-concurrency 8 --goodput ttft:200 tpot:50 --result-json out.json
    python -m lab.bench.serve ... --dataset sharegpt-like-json --dataset-path prompts.json

Requests: POST {base-url}{endpoint} (default /v1/completions; an endpoint ending in
/chat/completions sends `messages` and reads `delta.content`) with `stream: true` and
`stream_options.include_usage`, greedy (`temperature: 0`), `ignore_eos` when asked. The SSE
`data: {...}` lines are read until `data: [DONE]`.

Per request, as `vllm bench serve` measures it: a token chunk is a `data:` event with a
non-empty `choices` (its text may be empty: a token that ends inside a UTF-8 character or a
special token still arrives as a chunk; --text-chunks-only counts only chunks with non-empty text
instead); TTFT = the first token chunk; ITL = the gaps between token chunks; E2EL = until the last
token chunk (so E2EL - TTFT = sum(ITL); the usage-only chunk and [DONE] carry no token); output
tokens = usage.completion_tokens when the server reports it, else the token chunks; prompt tokens
= usage.prompt_tokens, else the dataset's count. TPOT = (E2EL - TTFT) / (output tokens - 1), over
requests with > 1 token. A request that fails (HTTP error, error event, broken stream, no token
chunk) is counted as failed; the run goes on.

Arrivals: --request-rate inf sends everything at once; a finite rate draws gaps from a gamma
distribution with shape = --burstiness and mean 1/rate (burstiness 1 = Poisson, lower = burstier,
as in vLLM). --max-concurrency caps the requests in flight (a semaphore).

Datasets: `random` = prompts of uniform random token ids (seeded) with lengths uniform in
[input_len * (1 - range_ratio), input_len * (1 + range_ratio)] (output lengths likewise); the
id range is --vocab-size, else the vocab size of --tokenizer DIR (config.json's vocab_size, else
the tokenizer's length), else that of the checkpoint the server's /v1/models names as its root
(lab serve and vllm serve: the checkpoint directory, when it is on this machine), else 1000. `sharegpt-like-json` = a JSON list of {"prompt": str, "output_len": int}
(prompt lengths counted with --tokenizer if given, else taken from the server's usage).

Goodput (--goodput ttft:MS tpot:MS e2el:MS, any subset): requests per second of the successful
requests that meet every given SLO.

`summarize(records, duration, goodput)` is the pure metric computation (no network).

Checked against `vllm bench serve` on the same `vllm serve` (one run of each, figures and
commands in experiments/results/2026-12-04-bench-serve-client.md). With random prompt ids many
tokens end inside a UTF-8 character and stream as empty-text chunks: hence vLLM's rule (every
chunk with a choice is a token) by default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

# ----------------------------------------------------------------------------- data


@dataclass
class RequestSpec:
    prompt: list[int] | str
    prompt_len: int  # what the dataset knows (-1: unknown, take it from usage)
    output_len: int


@dataclass
class RequestRecord:
    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0  # seconds
    latency: float = 0.0  # seconds (E2E)
    itl: list[float] = field(default_factory=list)  # seconds
    start: float = 0.0  # seconds since the benchmark began
    error: str = ""


DEFAULT_VOCAB = 1000  # random ids below this when neither the server nor the options say


def server_root(base_url: str, timeout: float = 10.0) -> str | None:
    """The served model's `root` from the server's /v1/models (lab and vLLM: the checkpoint
    directory), or None when the server does not say."""
    try:
        data = httpx.get(f"{base_url.rstrip('/')}/v1/models", timeout=timeout).json()
        return data["data"][0].get("root")
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


def random_vocab_size(tokenizer_dir: str | None, vocab_size: int | None, base_url: str) -> int:
    """The vocabulary random prompts draw from: --vocab-size, else --tokenizer's, else that of
    the checkpoint the server names (/v1/models `root`, when it is a directory here), else
    DEFAULT_VOCAB (ids a model with a smaller vocabulary refuses: every request fails)."""
    if vocab_size is not None:
        return vocab_size
    if tokenizer_dir:
        return vocab_size_of(tokenizer_dir, DEFAULT_VOCAB)
    root = server_root(base_url)
    if root and (Path(root) / "config.json").is_file():
        return vocab_size_of(root, DEFAULT_VOCAB)
    print(f"the server names no checkpoint here: random ids below {DEFAULT_VOCAB} "
          "(--vocab-size or --tokenizer to say)", file=sys.stderr)
    return DEFAULT_VOCAB


def vocab_size_of(tokenizer_dir: str | None, default: int) -> int:
    if not tokenizer_dir:
        return default
    cfg = Path(tokenizer_dir) / "config.json"
    if cfg.is_file():
        v = json.loads(cfg.read_text()).get("vocab_size")
        if v:
            return int(v)
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(tokenizer_dir))


def _len_range(n: int, ratio: float) -> tuple[int, int]:
    lo = max(1, math.floor(n * (1 - ratio)))
    return lo, max(lo, math.ceil(n * (1 + ratio)))


def random_dataset(num: int, input_len: int, output_len: int, range_ratio: float,
                   vocab_size: int, seed: int) -> list[RequestSpec]:
    """Random token-id prompts, lengths uniform in [len*(1-r), len*(1+r)]; same seed, same set."""
    rng = random.Random(seed)
    ilo, ihi = _len_range(input_len, range_ratio)
    olo, ohi = _len_range(output_len, range_ratio)
    specs = []
    for _ in range(num):
        n = rng.randint(ilo, ihi)
        ids = [rng.randrange(vocab_size) for _ in range(n)]
        specs.append(RequestSpec(ids, n, rng.randint(olo, ohi)))
    return specs


def json_dataset(path: str, num: int, tokenizer_dir: str | None,
                 default_output_len: int) -> list[RequestSpec]:
    """A JSON list of {"prompt": str, "output_len": int}; cycled if shorter than num."""
    items = json.loads(Path(path).read_text())
    if not items:
        raise ValueError(f"{path}: empty dataset")
    tok = None
    if tokenizer_dir:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    specs = []
    for i in range(num):
        it = items[i % len(items)]
        p = it["prompt"]
        n = len(tok(p)["input_ids"]) if tok is not None else -1
        specs.append(RequestSpec(p, n, int(it.get("output_len", default_output_len))))
    return specs


def arrival_gaps(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds to wait before each of n requests: 0 for inf; else gamma(shape=burstiness,
    scale=1/(rate*burstiness)), i.e. mean 1/rate (Poisson when burstiness == 1)."""
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0 or burstiness <= 0:
        raise ValueError("request rate and burstiness must be > 0")
    rng = random.Random(seed + 1)
    theta = 1.0 / (rate * burstiness)
    return [rng.gammavariate(burstiness, theta) for _ in range(n)]


# ----------------------------------------------------------------------------- client


async def _requests(specs: Sequence[RequestSpec], gaps: Sequence[float]
                    ) -> AsyncIterator[tuple[int, RequestSpec]]:
    for i, (spec, gap) in enumerate(zip(specs, gaps)):
        if gap > 0:
            await asyncio.sleep(gap)
        yield i, spec


def _payload(spec: RequestSpec, model: str, chat: bool, ignore_eos: bool) -> dict:
    body = {"model": model, "max_tokens": spec.output_len, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    if chat:
        if not isinstance(spec.prompt, str):
            raise ValueError("chat endpoints need text prompts (use --dataset sharegpt-like-json)")
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    return body


async def send_request(client: httpx.AsyncClient, url: str, payload: dict, spec: RequestSpec,
                       chat: bool, t0: float, text_only: bool = False) -> RequestRecord:
    rec = RequestRecord(prompt_len=max(spec.prompt_len, 0))
    st = time.perf_counter()
    rec.start = st - t0
    last = st
    chunks = 0
    usage = None
    try:
        async with client.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                rec.error = f"HTTP {resp.status_code}: {body[:200]}"
                return rec
            async for line in resp.aiter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if "error" in msg:
                    rec.error = str(msg["error"])[:200]
                    return rec
                if msg.get("usage"):
                    usage = msg["usage"]
                now = time.perf_counter()
                choices = msg.get("choices")
                if not choices:
                    continue  # e.g. the trailing usage-only chunk: no token
                ch = choices[0]
                text = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
                if not text and text_only:
                    continue
                if chunks == 0:
                    rec.ttft = now - st
                else:
                    rec.itl.append(now - last)
                last = now
                chunks += 1
        rec.latency = last - st
    except Exception as e:  # noqa: BLE001 - any failure is one failed request, not a crash
        rec.error = f"{type(e).__name__}: {e}"[:200]
        return rec
    if chunks == 0:
        rec.error = "no token chunk received"
        return rec
    rec.output_tokens = int(usage["completion_tokens"]) if usage and usage.get(
        "completion_tokens") is not None else chunks
    if usage and usage.get("prompt_tokens") is not None:
        rec.prompt_len = int(usage["prompt_tokens"])
    rec.success = True
    return rec


async def run_benchmark(base_url: str, endpoint: str, model: str, specs: Sequence[RequestSpec],
                        gaps: Sequence[float], max_concurrency: int | None, ignore_eos: bool,
                        timeout: float = 6 * 3600, text_only: bool = False
                        ) -> tuple[list[RequestRecord], float]:
    """Send every spec (after its gap), at most max_concurrency at a time; (records, seconds)."""
    url = base_url.rstrip("/") + endpoint
    chat = endpoint.rstrip("/").endswith("chat/completions")
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    limits = httpx.Limits(max_connections=max_concurrency or len(specs) or 1,
                          max_keepalive_connections=max_concurrency or len(specs) or 1)
    records: list[RequestRecord | None] = [None] * len(specs)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        t0 = time.perf_counter()

        async def one(i: int, spec: RequestSpec) -> None:
            payload = _payload(spec, model, chat, ignore_eos)
            if sem is None:
                records[i] = await send_request(client, url, payload, spec, chat, t0,
                                                  text_only)
            else:
                async with sem:
                    records[i] = await send_request(client, url, payload, spec, chat, t0,
                                                  text_only)

        tasks = [asyncio.create_task(one(i, s)) async for i, s in _requests(specs, gaps)]
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    return [r for r in records if r is not None], duration


# ----------------------------------------------------------------------------- metrics


def parse_goodput(items: Sequence[str] | None) -> dict[str, float] | None:
    """["ttft:200", "tpot:50"] -> {"ttft": 200.0, "tpot": 50.0} (milliseconds)."""
    if not items:
        return None
    out = {}
    for it in items:
        k, _, v = it.partition(":")
        k = k.strip().lower()
        if k not in ("ttft", "tpot", "e2el") or not v:
            raise ValueError(f"bad --goodput item {it!r}: want ttft:MS, tpot:MS or e2el:MS")
        out[k] = float(v)
    return out


def _stats(name: str, xs_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    xs = np.asarray(xs_s, dtype=np.float64) * 1000.0
    d = {}
    for stat, f in (("mean", np.mean), ("median", np.median), ("std", np.std)):
        d[f"{stat}_{name}_ms"] = float(f(xs)) if xs.size else 0.0
    for p in percentiles:
        d[f"p{p:g}_{name}_ms"] = float(np.percentile(xs, p)) if xs.size else 0.0
    return d


def request_tpot(r: RequestRecord) -> float | None:
    """(E2EL - TTFT) / (out - 1) in seconds, or None with <= 1 output token."""
    return (r.latency - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else None


def summarize(records: Sequence[RequestRecord], duration: float,
              goodput: dict[str, float] | None = None,
              percentiles: Sequence[float] = (99,)) -> dict:
    """The benchmark's numbers from per-request records (times in seconds; output in ms)."""
    ok = [r for r in records if r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    tpots = [t for r in ok if (t := request_tpot(r)) is not None]
    s: dict = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": total_out / duration if duration > 0 else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration > 0 else 0.0,
    }
    s |= _stats("ttft", [r.ttft for r in ok], percentiles)
    s |= _stats("tpot", tpots, percentiles)
    s |= _stats("itl", [x for r in ok for x in r.itl], percentiles)
    s |= _stats("e2el", [r.latency for r in ok], percentiles)
    if goodput:
        good = 0
        for r in ok:
            vals = {"ttft": r.ttft, "tpot": request_tpot(r) or 0.0, "e2el": r.latency}
            if all(vals[k] * 1000.0 <= slo for k, slo in goodput.items()):
                good += 1
        s["goodput_slos_ms"] = dict(goodput)
        s["good_requests"] = good
        s["request_goodput"] = good / duration if duration > 0 else 0.0
    return s


def format_table(s: dict, percentiles: Sequence[float] = (99,)) -> str:
    w = 50
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=w, c="=")]

    def row(label: str, v, fmt: str = "{:<10.2f}") -> None:
        lines.append(f"{label:<40} " + fmt.format(v))

    row("Successful requests:", s["completed"], "{:<10}")
    row("Failed requests:", s["failed"], "{:<10}")
    row("Benchmark duration (s):", s["duration"])
    row("Total input tokens:", s["total_input_tokens"], "{:<10}")
    row("Total generated tokens:", s["total_output_tokens"], "{:<10}")
    row("Request throughput (req/s):", s["request_throughput"])
    if "request_goodput" in s:
        row("Request goodput (req/s):", s["request_goodput"])
    row("Output token throughput (tok/s):", s["output_throughput"])
    row("Total token throughput (tok/s):", s["total_token_throughput"])
    for key, title, label in (("ttft", "Time to First Token", "TTFT"),
                              ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
                              ("itl", "Inter-token Latency", "ITL"),
                              ("e2el", "End-to-end Latency", "E2EL")):
        lines.append("{s:{c}^{n}}".format(s=title, n=w, c="-"))
        row(f"Mean {label} (ms):", s[f"mean_{key}_ms"])
        row(f"Median {label} (ms):", s[f"median_{key}_ms"])
        for p in percentiles:
            row(f"P{p:g} {label} (ms):", s[f"p{p:g}_{key}_ms"])
    lines.append("=" * w)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lab bench serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", required=True)
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests/s ('inf': all at once)")
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--dataset", choices=["random", "sharegpt-like-json"], default="random")
    p.add_argument("--dataset-path", default=None)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.0)
    p.add_argument("--tokenizer", default=None, help="checkpoint/tokenizer dir (vocab size)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="random token ids are drawn below this (default: --tokenizer's "
                        "vocabulary, else that of the checkpoint the server's /v1/models "
                        f"names as its root, else {DEFAULT_VOCAB})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="SLOs, e.g. ttft:200 tpot:50 e2el:2000")
    p.add_argument("--metric-percentiles", default="99", help="comma list, e.g. 50,90,99")
    p.add_argument("--timeout", type=float, default=6 * 3600, help="per-request seconds")
    p.add_argument("--text-chunks-only", action="store_true",
                   help="count only chunks with non-empty text as tokens (default: every chunk "
                        "with a choice, as vllm bench serve does)")
    p.add_argument("--result-json", default=None)
    return p


def main(argv: Sequence[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    goodput = parse_goodput(args.goodput)
    percentiles = [float(x) for x in args.metric_percentiles.split(",") if x.strip()]
    if args.dataset == "random":
        specs = random_dataset(args.num_prompts, args.input_len, args.output_len,
                               args.range_ratio,
                               random_vocab_size(args.tokenizer, args.vocab_size, args.base_url),
                               args.seed)
    else:
        if not args.dataset_path:
            raise SystemExit("--dataset sharegpt-like-json needs --dataset-path")
        specs = json_dataset(args.dataset_path, args.num_prompts, args.tokenizer,
                             args.output_len)
    gaps = arrival_gaps(len(specs), args.request_rate, args.burstiness, args.seed)
    print(f"{len(specs)} requests to {args.base_url}{args.endpoint}, rate {args.request_rate}, "
          f"burstiness {args.burstiness}, max concurrency {args.max_concurrency}", flush=True)
    records, duration = asyncio.run(run_benchmark(
        args.base_url, args.endpoint, args.model, specs, gaps, args.max_concurrency,
        args.ignore_eos, args.timeout, args.text_chunks_only))
    s = summarize(records, duration, goodput, percentiles)
    print(format_table(s, percentiles))
    errors = [r.error for r in records if not r.success]
    if errors:
        print(f"{len(errors)} failed; first error: {errors[0]}", file=sys.stderr)
    if args.result_json:
        out = dict(s)
        out |= {"config": {k: (v if not (isinstance(v, float) and math.isinf(v)) else "inf")
                           for k, v in vars(args).items()},
                "input_lens": [r.prompt_len for r in records],
                "output_lens": [r.output_tokens for r in records],
                "ttfts": [r.ttft for r in records],
                "itls": [r.itl for r in records],
                "e2els": [r.latency for r in records],
                "tpots": [request_tpot(r) for r in records],
                "starts": [r.start for r in records],
                "successes": [r.success for r in records],
                "errors": [r.error for r in records]}
        Path(args.result_json).write_text(json.dumps(out, indent=1))
    return s


def cli(argv: Sequence[str] | None = None) -> int:
    """The command's exit status: 0 when every request succeeded, 1 when any failed (the
    table is printed either way), so a script or CI sees a run that measured failures."""
    return 1 if main(argv)["failed"] else 0


if __name__ == "__main__":
    sys.exit(cli())

