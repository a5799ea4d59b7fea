"""Profile this machine for `sim/step_time=profiled`: a microbenchmark sweep of the real engine,
each operator of each step timed, written as a profile JSON. No run directory is needed.

    python -m lab.sim.profile model=tiny_llama -o profile.json
    python -m lab.sim.profile model=bench_qwen3_06b attention=torch cpu_threads=1 -o qwen.json
    python run.py executor=sim sim/step_time=profiled sim.step_time.path=profile.json sim.device=cpu

The overrides compose the engine exactly as `python run.py` would (same model, dtype, attention,
kernels, threads, loggers); the engine runs in this process (executor=uniproc, inproc) with a
cache large enough for the sweep and prefix caching on (the sweep reaches a context through a
prefix hit). After a warm-up it drives the engine through designed batches, stepping it the way
`run.py`'s replay does, and times each step's loop (from the previous step's end, so request
submission, output processing and the loggers count) and, inside it, the model's forward, the
attention backend (every layer), the LM head and the sampler (lab.metrics.timers):

    decode     B requests of context L decoding together (B on powers of two and the halves
               between, L = 32, 128, 512)
    prefill    one chunk of q tokens after c cached ones (q, c + q on a grid)
    admit      N short prompts admitted at once
    idle       one prompt arriving after the engine waited for it (timed from the arrival)
    mixed      B decodes with a prefill chunk beside them

From the samples it builds the operators of lab/sim/step_time/profiled.py (medians and p10/p90
per point, the CPU term by non-negative least squares) and the distribution of measured /
predicted step times (the variance model). The JSON records the model, device, engine
configuration, machine and commit it was measured with.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from lab.core.step import StepShape
from lab.platform import source_commit
from lab.sim.step_time.profiled import (
    CPU_FEATURES,
    PROFILE_KIND,
    Curve,
    Operators,
    chunk_point,
    decode_point,
    padded_point,
)

#: engine settings a profile depends on (its fingerprint); everything else — the cache size,
#: scheduler, preemption, workload — changes which steps a run takes, not what a step costs
FINGERPRINT_KEYS = ("dtype", "block_size", "cpu_threads", "compile", "kv_cache_dtype",
                    "enable_prefix_caching", "device")
FINGERPRINT_GROUPS = ("model", "attention", "kernels", "quant", "logger")
RATIO_QUANTILES = 101  # stored quantiles of measured / predicted step time


@dataclass
class Sample:
    """One profiled step: its shape, what it was designed to measure, and its timings (s)."""

    shape: StepShape
    tag: str  # decode | prefill | admit | mixed | other
    loop: float
    forward: float
    attention: float
    logits: float
    sampling: float


@dataclass
class SweepPlan:
    """The grids of the sweep (from the engine's limits and the command line)."""

    batches: list[int]
    contexts: list[int]
    chunks: list[int]
    keys: list[int]
    admits: list[int]
    mixed_batches: list[int]
    repeats: int
    decode_steps: int
    max_kv_tokens: int  # a batch whose cache would pass this is left to extrapolation


@dataclass
class Profiler:
    """Drives an engine through designed batches and records each step."""

    engine: Any
    rng: random.Random
    samples: list[Sample] = field(default_factory=list)
    _counter: int = 0
    _live: set[str] = field(default_factory=set)  # submitted ids (finished ones too)

    def __post_init__(self) -> None:
        from lab.metrics.timers import Timers

        engine = self.engine
        runner = engine.core.executor.worker.runner
        self.device = next(runner.model.parameters()).device.type  # cpu | cuda
        sync = None
        if self.device == "cuda":
            import torch

            sync = torch.cuda.synchronize
        self.timers = Timers(sync)
        self.timers.wrap(runner.model, "forward", "forward")
        self.timers.wrap(runner.model, "compute_logits", "logits")
        self.timers.wrap(runner.sampler, "forward", "sampling")
        self.timers.wrap(runner.attn_backend, "forward", "attention")
        if hasattr(runner.attn_backend, "forward_mla"):
            self.timers.wrap(runner.attn_backend, "forward_mla", "attention")
        scheduler = engine.core.scheduler
        self._schedule = scheduler.schedule
        self._shapes: list[StepShape] = []

        def schedule(*args, **kwargs):
            out = self._schedule(*args, **kwargs)
            self._shapes.append(out.shape)
            return out

        scheduler.schedule = schedule
        self.padded = bool(getattr(runner.attn_backend, "padded_batches", False))
        self.block_size = engine.cfg.block_size
        from lab.engine.warmup import ordinary_token_ids

        self._tokens = [int(t) for t in ordinary_token_ids(engine)]

    def close(self) -> None:
        self.timers.close()
        del self.engine.core.scheduler.schedule

    def prompt(self, n: int) -> list[int]:
        return [self.rng.choice(self._tokens) for _ in range(n)]

    def submit(self, prompt: list[int], max_tokens: int) -> str:
        from lab.core.sampling_params import SamplingParams

        self._counter += 1
        rid = f"profile-{self._counter}"
        self._live.add(rid)
        self.engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                                       temperature=0.0), request_id=rid)
        return rid

    def step(self, tag: str = "other", start: float | None = None,
             after_idle: bool = False) -> None:
        """One engine step, recorded; `start`: when the loop began (a submission before it)."""
        before = dict(self.timers.seconds)
        t0 = time.perf_counter() if start is None else start
        outputs = self.engine.step()
        loop = time.perf_counter() - t0
        now = self.timers.seconds
        part = {k: now.get(k, 0.0) - before.get(k, 0.0)
                for k in ("forward", "attention", "logits", "sampling")}
        shape = self._shapes.pop() if self._shapes else StepShape()
        self._shapes.clear()
        shape = replace(shape, num_finished_reqs=sum(o.finished for o in outputs),
                        after_idle=after_idle)
        if shape.num_tokens:
            self.samples.append(Sample(shape, tag, loop, **part))

    def drain(self) -> None:
        while self.engine.has_unfinished_requests():
            self.step()

    def abort_all(self) -> None:
        """End every request now (after a designed step, its decodes teach nothing new)."""
        self.engine.abort_request(list(self._live))
        self._live.clear()
        self.engine.take_pending()

    # -- the designed batches --------------------------------------------------------------
    def decode(self, batch: int, context: int, steps: int) -> None:
        """`batch` requests whose contexts reach `context` over `steps` decode steps (prompts
        of context - steps tokens), then the decodes."""
        self.batch(batch, context - steps, steps + 1)
        self.drain()
        self._live.clear()

    def batch(self, n: int, length: int, max_tokens: int) -> None:
        """n requests of `length` prompt tokens that share all but their last block: the first
        prefills the shared part, the others find it in the prefix cache, so a batch of long
        contexts costs one long prefill (attention reads each request's blocks all the same).
        Returns once every one has its prompt computed."""
        shared = self.prompt(length - 1)
        self.submit(shared + self.prompt(1), max_tokens + 2)
        while self.engine.core.scheduler.waiting or self._prefilling():
            self.step()
        t0 = time.perf_counter()
        for _ in range(n - 1):
            self.submit(shared + self.prompt(1), max_tokens)
        if n > 1:
            self.step("admit", t0)
        while self.engine.core.scheduler.waiting or self._prefilling():
            self.step()

    def _prefilling(self) -> bool:
        return any(r.num_computed_tokens < r.num_prompt_tokens
                   for r in self.engine.core.scheduler.running)

    def jittered(self, n: int, jitter: bool) -> int:
        """n, or (jitter) n less up to a block's worth less one: a run's token counts are rarely
        multiples of 16, and a GEMM of 124 rows can take longer than one of 128 (measured: 20 %
        for bench_qwen3_06b on this CPU), so repeats past the first sample unaligned counts."""
        return n - self.rng.randrange(min(self.block_size, n)) if jitter else n

    def prefill(self, q: int, c: int, jitter: bool = False) -> None:
        """One chunk of q new tokens after c cached ones (the c through a prefix hit)."""
        prefix = self.prompt(c)
        if c:
            self.submit(prefix, 1)
            self.drain()
        t0 = time.perf_counter()
        self.submit(prefix + self.prompt(self.jittered(q, jitter)), 1)
        self.step("prefill", t0)
        self.abort_all()

    def admit(self, n: int, q: int, jitter: bool = False) -> None:
        """n prompts of q tokens arriving together, then a few decode steps."""
        t0 = time.perf_counter()
        for _ in range(n):
            self.submit(self.prompt(self.jittered(q, jitter)), 4)
        self.step("admit", t0)
        self.step()  # the first decode of a fresh batch
        self.abort_all()

    def after_idle(self, q: int, jitter: bool = False, wait: float = 0.02) -> None:
        """A prompt of q tokens arriving after the engine waited `wait` s with nothing to do, as
        run.py's replay waits (Clock.sleep_until): the step is timed from the arrival it slept
        until, so the sleep's overshoot and a cold first step count, as in a real TTFT."""
        from lab.clock import Clock

        clock = Clock()
        arrival = clock.now() + wait
        clock.sleep_until(arrival)
        self.submit(self.prompt(self.jittered(q, jitter)), 1)
        self.step("idle", arrival, after_idle=True)
        self.abort_all()

    def mixed(self, batch: int, context: int, q: int, jitter: bool = False) -> None:
        """`batch` requests decoding (contexts up to `context`) with a fresh chunk of q tokens
        admitted beside them."""
        self.batch(batch, context - 4, 4)
        t0 = time.perf_counter()
        self.submit(self.prompt(self.jittered(q, jitter)), 1)
        self.step("mixed", t0)
        self.abort_all()

    def sweep(self, plan: SweepPlan, phase: str | None = None) -> None:
        """The designed batches of the plan (of one phase: decode, prefill, admit, mixed)."""
        fits = [(b, c) for c in plan.contexts for b in plan.batches
                if b * c <= plan.max_kv_tokens]
        if phase in (None, "decode"):
            for batch, context in fits:
                self.decode(batch, context, plan.decode_steps)
        for repeat in range(plan.repeats):
            jitter = repeat > 0
            if phase in (None, "prefill"):
                for key in plan.keys:
                    for q in plan.chunks:
                        if q <= key:
                            self.prefill(q, key - q, jitter)
            if phase in (None, "admit"):
                for n in plan.admits:
                    self.admit(n, plan.chunks[0], jitter)
            if phase in (None, "idle"):
                for q in plan.chunks[:2]:
                    self.after_idle(q, jitter)
            if phase in (None, "mixed"):
                for batch, context in fits:
                    if batch in plan.mixed_batches and context in plan.keys[1:]:
                        for q in plan.chunks[:2]:
                            self.mixed(batch, context, q, jitter)
        tag_decodes(self.samples)


def tag_decodes(samples: list[Sample]) -> None:
    """Every pure-decode step is a decode sample, whatever batch it was designed for."""
    for s in samples:
        if s.shape.num_prefill_reqs == 0 and s.shape.num_decode_reqs:
            s.tag = "decode"


def curve(points: dict[float, list[float]], bins_per_octave: int = 0) -> dict[str, list[float]]:
    """{x: samples} -> {x, median, p10, p90, n} lists sorted by x; the medians made
    non-decreasing in x (more work never takes less time: a noisy point is pooled with its
    neighbours, weighted by its samples), p10/p90 as measured. `bins_per_octave`: the x that
    fall in one bin of that many per doubling are one point (their samples pooled, at their
    samples' mean x), for counts the sweep hits only here and there (tokens of a step)."""
    if bins_per_octave:
        binned: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for x, values in points.items():
            binned[round(bins_per_octave * math.log2(max(x, 1)))] += [(x, v) for v in values]
        points = {float(np.mean([x for x, _ in pairs])): [v for _, v in pairs]
                  for pairs in binned.values()}
    xs = sorted(points)
    stat = {name: [float(np.percentile(points[x], p)) for x in xs]
            for name, p in (("median", 50), ("p10", 10), ("p90", 90))}
    counts = [len(points[x]) for x in xs]
    stat["median"] = isotonic(stat["median"], counts)
    return {"x": [float(x) for x in xs], **stat, "n": counts}


def isotonic(ys: list[float], weights: list[int]) -> list[float]:
    """The non-decreasing sequence closest to ys in weighted least squares (pool adjacent
    violators)."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for y, w in zip(ys, weights):
        blocks.append([y, float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1, n1), (m2, w2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return [m for m, _, n in blocks for _ in range(n)]


def surface(points: dict[tuple[float, float], list[float]]) -> list[dict]:
    """{(x, key): samples} -> one row {key, x, median, p10, p90, n} per key."""
    by_key: dict[float, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (x, key), values in points.items():
        by_key[key][x] += values
    return [{"key": float(key), **curve(by_key[key])} for key in sorted(by_key)]


def build_operators(samples: list[Sample], padded: bool, block_size: int) -> dict[str, Any]:
    """The operator tables of a profile from its samples. Padded backends: the attention of a
    step with prefills over (requests x max context: the keys gathered, max query: the rows
    each attends with), both in whole blocks."""
    model, logits, sampling = defaultdict(list), defaultdict(list), defaultdict(list)
    decode, prefill = defaultdict(list), []
    for s in samples:
        sh = s.shape
        if sh.after_idle:  # a cold step: its extra is the cpu term's (fit_cpu)
            continue
        model[sh.num_tokens].append(s.forward - s.attention)
        if sh.num_sampled_reqs:
            logits[sh.num_sampled_reqs].append(s.logits)
            sampling[sh.num_sampled_reqs].append(s.sampling)
        if s.tag == "decode":
            decode[decode_point(sh, padded, block_size)].append(s.attention)
        elif s.tag == "prefill" or (padded and s.tag in ("admit", "mixed")):
            prefill.append(s)
    tables = {"model": curve(model, 4), "logits": curve(logits, 4),
              "sampling": curve(sampling, 4), "decode": surface(decode)}
    points = defaultdict(list)
    for s in prefill:  # one chunk each for a ragged backend (the sweep's prefill steps)
        point = (padded_point(s.shape, block_size) if padded
                 else chunk_point(*s.shape.prefill_chunks[0], block_size))
        points[point].append(s.attention)
    tables["padded" if padded else "prefill"] = surface(points)
    return tables


def warm_parts(ops: Operators, shape: StepShape) -> float:
    """The predicted seconds of a step's forward, LM head and sampler (not its cpu term)."""
    parts = ops.parts(shape)
    return parts["model"] + parts["attention"] + parts["logits"] + parts["sampling"]


def cpu_seconds(s: Sample) -> float:
    """What a step's loop spent outside the model's forward, the LM head and the sampler."""
    return s.loop - s.forward - s.logits - s.sampling


def fit_cpu(samples: list[Sample], warm: Operators) -> dict[str, Any]:
    """The cpu term: a curve over requests of steady decode steps (none admitted or finishing,
    not the first after a prefill: the batch's state changes there),
    and non-negative least squares of what it leaves of every step's overhead on CPU_FEATURES
    (each row weighted by 1 / its loop time, so the many short steps count as much as the few
    long ones). A step after idle counts its whole loop less what `warm` operators predict for
    its forward, LM head and sampler: a cold step's slower forward is part of its extra."""
    steady: dict[float, list[float]] = defaultdict(list)
    for previous, s in zip([None, *samples[:-1]], samples):
        if (s.tag == "decode" and not s.shape.num_finished_reqs and previous is not None
                and not previous.shape.num_prefill_reqs):
            steady[s.shape.num_reqs].append(cpu_seconds(s))
    decode = curve(steady)
    base = Curve.of(decode)
    x = np.array([[s.shape.num_new_reqs, s.shape.num_finished_reqs, s.shape.num_prefill_tokens,
                   float(s.shape.num_prefill_reqs > 0), float(s.shape.after_idle)]
                  for s in samples], dtype=float)
    y = np.array([(s.loop - warm_parts(warm, s.shape) if s.shape.after_idle else cpu_seconds(s))
                  - base.at(s.shape.num_reqs) for s in samples])
    w = 1.0 / np.array([max(s.loop, 1e-6) for s in samples])
    xw, yw = x * w[:, None], y * w
    scale = np.linalg.norm(xw, axis=0)
    scale[scale == 0] = 1.0
    coef = nnls(xw / scale, yw) / scale
    resid = y - x @ coef
    return {"decode": decode, "features": list(CPU_FEATURES),
            "coefficients": [float(c) for c in coef],
            "fit": {"median_abs_s": float(np.median(np.abs(resid)))}}


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson-Hanson active set; numpy only)."""
    m, n = a.shape
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(m, n)
    for _ in range(max_iter or 3 * n):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if not passive.any() or z[passive].min() > 0:
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
        x = z
        w = a.T @ (b - a @ x)
    return x


def plan_sweep(engine: Any, max_batch: int, max_context: int, repeats: int,
               max_kv_gb: float) -> SweepPlan:
    """Powers-of-two grids inside the engine's limits (batch, context, chunk) and a KV budget:
    a (batch, context) pair whose cache would pass `max_kv_gb` is left to extrapolation."""
    cfg = engine.cfg
    bs = cfg.block_size
    budget = cfg.max_num_batched_tokens
    max_context = min(max_context, engine.max_model_len - 8)
    # decode batches: powers of two and the halves between (a run's batches are any size)
    batches = [b for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
               if b <= min(max_batch, cfg.max_num_seqs)]
    # decode contexts: powers of two (attention is not linear in context once the keys a step
    # gathers leave the CPU's caches: 192 between 128 and 512 was predicted 2.4x its time)
    contexts = [c for c in (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
                if c <= max_context and c % bs == 0]
    chunks = [q for q in (32, 128, 512, 2048) if q <= budget and q % bs == 0]
    if not contexts or not chunks:
        raise ValueError(f"block_size={bs}, max_num_batched_tokens={budget} and max_model_len="
                         f"{engine.max_model_len} leave no grid to profile (contexts and chunks "
                         "are multiples of the block size from 32 tokens)")
    return SweepPlan(batches, contexts, chunks, keys=contexts[::2],
                     admits=[b for b in batches if b in (2, 4, 8, 16)],
                     mixed_batches=[b for b in batches if b in (4, 16)],
                     repeats=repeats, decode_steps=6,
                     max_kv_tokens=int(max_kv_gb * 2**30 // engine.kv_bytes_per_token))


def profile_engine(overrides: list[str], plan_blocks: int, scratch: Path) -> Any:
    """An engine composed as `run.py OVERRIDES` would be, in this process, with its loggers
    started on the `scratch` directory, a cache of `plan_blocks` blocks and prefix caching on."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from lab.config.compose import compose_config
    from lab.engine.llm_engine import LLMEngine
    from lab.metrics.memory import InMemoryLogger

    cfg = compose_config([*overrides, "executor=uniproc", "engine_client=inproc",
                          f"num_gpu_blocks={plan_blocks}", "enable_prefix_caching=true"])
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
    loggers.append(InMemoryLogger())  # replay's own record of a run
    engine = LLMEngine(cfg, loggers=loggers)
    for logger in loggers:
        logger.on_start(scratch, OmegaConf.to_container(cfg, resolve=True), None)
    return engine


def fingerprint(cfg: Any) -> dict[str, Any]:
    """What a profile depends on (FINGERPRINT_KEYS and the options of FINGERPRINT_GROUPS)."""
    from omegaconf import OmegaConf

    out: dict[str, Any] = {k: OmegaConf.to_container(cfg, resolve=True).get(k)
                           for k in FINGERPRINT_KEYS}
    for group in FINGERPRINT_GROUPS:
        node = cfg.get(group)
        out[group] = (OmegaConf.to_container(node, resolve=True)
                      if node is not None and not isinstance(node, (str, int, float)) else node)
    return out


def machine() -> dict[str, Any]:
    """This machine, as a profile records it."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu": cpu, "cpus": os.cpu_count(), "gpu": gpu, "platform": platform.platform(),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def ratio_quantiles(samples: list[Sample], ops: Operators) -> tuple[list[float], dict]:
    """Quantiles of measured / predicted loop time over the samples, and the fit's error."""
    ratios = np.array([s.loop / max(ops.predict(s.shape), 1e-9) for s in samples])
    q = np.quantile(ratios, np.linspace(0, 1, RATIO_QUANTILES))
    err = np.abs(ratios - 1)
    return [float(v) for v in q], {"num_steps": len(samples), "median_abs_error": float(
        np.median(err)), "mean_abs_error": float(err.mean()), "p90_abs_error": float(
        np.quantile(err, 0.9))}


def build_profile(samples: list[Sample], padded: bool, meta: dict[str, Any]) -> dict[str, Any]:
    """The profile JSON of a sweep's samples (meta: model, device, config, machine, ...)."""
    block_size = int(meta["config"]["block_size"])
    tables = build_operators(samples, padded, block_size)
    profile = {"kind": PROFILE_KIND, **meta, "attention_padded": padded, "operators": tables}
    tables["cpu"] = {"decode": {"x": [1.0], "median": [0.0]},
                     "coefficients": [0.0] * len(CPU_FEATURES)}  # the others first
    tables["cpu"] = fit_cpu(samples, Operators.of(profile))
    ops = Operators.of(profile)
    profile["step_ratio_quantiles"], profile["fit"] = ratio_quantiles(samples, ops)
    profile["samples"] = [sample_record(s) for s in samples]  # to refit or study offline
    return profile


def rebuild(profile: dict[str, Any]) -> dict[str, Any]:
    """A profile's operators built anew from its stored samples (after a change to how they
    are built: no engine, no sweep)."""
    samples = [Sample(StepShape(**{**r["shape"], "prefill_chunks": tuple(
        map(tuple, r["shape"]["prefill_chunks"]))}), r["tag"], r["loop"], r["forward"],
        r["attention"], r["logits"], r["sampling"]) for r in profile["samples"]]
    meta = {k: v for k, v in profile.items() if k not in (
        "kind", "attention_padded", "operators", "step_ratio_quantiles", "fit", "samples")}
    return build_profile(samples, profile["attention_padded"], meta)


def sample_record(s: Sample) -> dict[str, Any]:
    """A sample as JSON: its shape's fields, its tag and its timings."""
    shape = {k: (list(map(list, v)) if k == "prefill_chunks" else v)
             for k, v in vars(s.shape).items()}
    return {"tag": s.tag, "shape": shape, "loop": s.loop, "forward": s.forward,
            "attention": s.attention, "logits": s.logits, "sampling": s.sampling}


def run_profile(overrides: list[str], max_batch: int = 64, max_context: int = 512,
                repeats: int = 3, max_kv_gb: float = 2.0, seed: int = 0,
                log=print) -> dict[str, Any]:
    """Compose, warm up, sweep and build the profile of `run.py OVERRIDES` on this machine."""
    from lab.config.compose import compose_with_choices

    cfg, choices = compose_with_choices(overrides)
    blocks = max(max_batch * (max_context + 64) // cfg.block_size + 64, 256)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lab-profile-") as scratch:  # the loggers' output
        engine = profile_engine(overrides, blocks, Path(scratch))
        try:
            plan = plan_sweep(engine, max_batch, max_context, repeats, max_kv_gb)
            profiler = Profiler(engine, random.Random(seed))
            sweep_engine(profiler, plan, lambda phase: log(
                f"  {phase}: {len(profiler.samples)} steps so far, "
                f"{time.perf_counter() - t0:.0f} s"))
        finally:
            engine.shutdown()
    samples = profiler.samples
    log(f"profiled {len(samples)} steps in {time.perf_counter() - t0:.0f} s "
        f"(batches {plan.batches}, contexts {plan.contexts}, chunks {plan.chunks})")
    meta = {"model": choices.get("model"), "device": profiler.device,
            "attention": choices.get("attention"), "config": fingerprint(cfg),
            "choices": choices, "overrides": list(overrides), "machine": machine(),
            "commit": source_commit(), "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "plan": vars(plan)}
    return build_profile(samples, profiler.padded, meta)


def sweep_engine(profiler: Profiler, plan: SweepPlan, done: Any) -> None:
    """The engine's own warm-up and the sweep's shapes once (first calls: allocations, oneDNN
    primitives, lazy builds), the engine reset as replay leaves a warmed one (heap frozen,
    cache empty), then every phase of the plan (`done(phase)` after each)."""
    from lab.engine.warmup import warm_up

    try:
        warm_up(profiler.engine)
        profiler.sweep(SweepPlan(plan.batches[:2], plan.contexts[:1], plan.chunks[:2],
                                 plan.contexts[:1], plan.admits[:1], plan.mixed_batches[:1], 1,
                                 2, plan.max_kv_tokens))
        profiler.samples.clear()
        profiler.engine.core.reset_for_run()
        for phase in ("decode", "prefill", "admit", "idle", "mixed"):
            profiler.sweep(plan, phase)
            done(phase)
    finally:
        profiler.close()


def allreduce_table(world_size: int, profile: dict[str, Any]) -> dict[str, Any]:
    """A measured all-reduce table (lab/sim/comm.py) over `world_size` local processes, gloo on
    the CPU (nccl on a GPU machine), from 16 B to 16 MiB."""
    from lab.sim.comm import DEFAULT_SIZES, MeasuredAllReduce, measure_allreduce

    backend = "nccl" if profile["device"] == "cuda" else "gloo"
    timings = measure_allreduce(world_size, DEFAULT_SIZES, backend=backend)
    source = f"measure_allreduce {backend} x {world_size} on {profile['machine']['cpu']}"
    return MeasuredAllReduce.from_timings(timings, world_size, source).to_dict()


def summary_lines(profile: dict[str, Any]) -> list[str]:
    """A few lines on a profile: where, what, and how well its operators explain its steps."""
    fit = profile["fit"]
    cpu = dict(zip(profile["operators"]["cpu"]["features"],
                   profile["operators"]["cpu"]["coefficients"]))
    return [f"{profile['model']} ({profile['attention']}, {profile['config']['dtype']}) on "
            f"{profile['machine']['cpu']} x{profile['machine']['cpus']}, commit "
            f"{profile['commit']}",
            "cpu term: steady decode " + " ".join(
                f"{x:g}:{1e3 * y:.3f}" for x, y in zip(profile["operators"]["cpu"]["decode"]["x"],
                                                         profile["operators"]["cpu"]["decode"]["median"]))
            + " ms; " + "  ".join(f"{k} {v * 1e3:.4f} ms" for k, v in cpu.items()),
            f"{fit['num_steps']} steps: |measured / predicted - 1| median "
            f"{100 * fit['median_abs_error']:.1f} %, p90 {100 * fit['p90_abs_error']:.1f} %"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lab.sim.profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="run.py overrides (model=..., attention=...)")
    p.add_argument("-o", "--output", type=Path, default=Path("profile.json"))
    p.add_argument("--max-batch", type=int, default=64, help="largest decode batch swept")
    p.add_argument("--max-context", type=int, default=512, help="longest context swept")
    p.add_argument("--repeats", type=int, default=3, help="samples per prefill/admit point")
    p.add_argument("--max-kv-gb", type=float, default=2.0,
                   help="skip decode batches whose KV would pass this (GiB)")
    p.add_argument("--seed", type=int, default=0, help="the sweep's prompt tokens")
    p.add_argument("--allreduce-ranks", type=int, default=0, metavar="N",
                   help="also time all-reduces between N local processes (gloo on the CPU) "
                        "and store the table: sim.allreduce=THIS_PROFILE costs TP=N with it")
    p.add_argument("--rebuild", type=Path, metavar="PROFILE",
                   help="no sweep: build PROFILE's operators anew from its stored samples")
    args = p.parse_args(argv)
    if args.rebuild:
        profile = rebuild(json.loads(args.rebuild.read_text()))
    else:
        profile = run_profile(args.overrides, args.max_batch, args.max_context, args.repeats,
                              args.max_kv_gb, args.seed)
    if args.allreduce_ranks > 1:
        profile["allreduce"] = allreduce_table(args.allreduce_ranks, profile)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(profile, indent=1) + "\n")
    print("\n".join(summary_lines(profile)) + f"\n-> {args.output}")


if __name__ == "__main__":
    main()
