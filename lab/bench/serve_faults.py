"""A fault soak of `lab serve`: does a server under load survive what a network does to it?

    python -m lab.bench.serve_faults                  # about 2 minutes on 2 cores
    python -m lab.bench.serve_faults --seconds 60 --clients 16 --result-json soak.json

Five phases, each on a fresh `lab serve` process (tiny_llama, engine core in its own process):

1. load: `--clients` loops send completions (streaming or not, at random) for `--seconds`; a
   third of them leave early (a stream closed, a plain request's connection dropped). Meanwhile
   50 MB bodies arrive (they must get 413 while /health keeps answering: its latency during
   them is measured), and the core is stopped (SIGSTOP) for `--stop-s` seconds, shorter than
   its core_timeout_s, then continued: requests just wait. Once the load ended, the KV cache
   must hold no block.
2. cancel: a plain request asking for n=16384 x 64 tokens whose client leaves after 3 s: its
   generation must stop within 1 s (lab:generation_tokens_total stops growing), and a short
   request sent next is answered at once.
3. kill: with requests in flight, the core is killed (kill -9): each must fail with the
   engine's 503 error, and the server must exit non-zero by itself.
4. hang: with requests in flight, the core is stopped for longer than core_timeout_s: each
   must fail with a 503, /health must say 503, the server must exit non-zero.
5. SIGTERM: with requests in flight, the server gets SIGTERM: it must exit 0 within its
   shutdown timeout plus a margin, its requests ended, its core's IPC directory removed.

A request is `ok` (answered), `left` (its client went away on purpose), `failed` with the right
error (an OpenAI error object whose code is the expected one: 413 for the big bodies, 503 once
the core is gone, in a stream's in-band error or as the answer; or a connection the dying server
cut), `refused` (no server listening any more: after SIGTERM), `wrong` (any other answer) or
`hung` (no answer within --request-timeout). The table
printed last must show 0 hung, 0 wrong, 0 KV blocks leaked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from lab.bench.server_process import ServerProcess, metric

NUM_BLOCKS = 256
ENGINE = ["model=tiny_llama", "attention=torch", f"num_gpu_blocks={NUM_BLOCKS}", "block_size=4",
          "max_model_len=256"]
PROMPTS = ["Hello there", "The quick brown fox", "Once upon a time", "A B C D E F G",
           "In the beginning"]
BIG_BODY_BYTES = 50 * 1024 * 1024


@dataclass
class Tally:
    """Outcomes of one phase's requests."""

    outcomes: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def add(self, outcome: str, note: str | None = None) -> None:
        self.outcomes[outcome] += 1
        if note and len(self.notes) < 10:
            self.notes.append(note)


def _is_error(obj: object, codes: tuple[int, ...]) -> bool:
    """Whether `obj` (a parsed body, or its JSON text) is an OpenAI error object with one of
    these codes."""
    if isinstance(obj, (str, bytes)):
        try:
            obj = json.loads(obj)
        except ValueError:
            return False
    err = obj.get("error") if isinstance(obj, dict) else None
    return isinstance(err, dict) and err.get("code") in codes and bool(err.get("message")) \
        and "type" in err


async def one_request(c: httpx.AsyncClient, rng: random.Random, tally: Tally, *,
                      leave: bool, errors: tuple[int, ...], timeout: float) -> None:
    """One completion, streaming or not; `leave`: the client goes away early on purpose."""
    stream = rng.random() < 0.5
    body = {"prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(8, 48),
            "ignore_eos": True, "n": rng.choice((1, 1, 1, 2)), "stream": stream}
    work = _streamed(c, body, errors) if stream else _plain(c, body, errors)
    try:
        if leave:
            try:
                await asyncio.wait_for(work, rng.uniform(0.05, 0.5))
                tally.add("ok")
            except TimeoutError:
                tally.add("left")
            return
        tally.add(*await asyncio.wait_for(work, timeout))
    except TimeoutError:
        tally.add("hung", f"no answer within {timeout} s: {body}")
    except httpx.ConnectError:
        raise
    except httpx.HTTPError as e:
        tally.add("failed" if 503 in errors else "wrong", f"{type(e).__name__}: {e}")


async def _plain(c: httpx.AsyncClient, body: dict, errors: tuple[int, ...]) -> tuple:
    r = await c.post("/v1/completions", json=body)
    if r.status_code == 200:
        return ("ok",)
    ok = r.status_code in errors and _is_error(r.text, (r.status_code,))
    return ("failed",) if ok else ("wrong", f"{r.status_code}: {r.text[:200]}")


async def _streamed(c: httpx.AsyncClient, body: dict, errors: tuple[int, ...]) -> tuple:
    async with c.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode()
            ok = r.status_code in errors and _is_error(text, (r.status_code,))
            return ("failed",) if ok else ("wrong", f"{r.status_code}: {text[:200]}")
        last = None
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[6:])
            elif line == "data: [DONE]":
                break
    if isinstance(last, dict) and "error" in last:
        return ("failed",) if _is_error(last, errors) else ("wrong", str(last)[:200])
    return ("ok",)


async def client_loop(url: str, seed: int, until: float, tally: Tally, timeout: float,
                      errors: tuple[int, ...] = (503,)) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=None) as c:
        while time.monotonic() < until:
            try:
                await one_request(c, rng, tally, leave=rng.random() < 1 / 3, errors=errors,
                                  timeout=timeout)
            except httpx.ConnectError:  # the server is gone (the SIGTERM phase): stop here
                tally.add("refused")
                return


async def big_bodies(url: str, until: float, tally: Tally, windows: list) -> None:
    """50 MB bodies, one after another: each must get 413; `windows` gets their (start, end)."""
    body = b'{"prompt": "' + b"x" * BIG_BODY_BYTES + b'"}'
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        while time.monotonic() < until:
            start = time.monotonic()
            try:
                r = await c.post("/v1/completions", content=body,
                                 headers={"Content-Type": "application/json"})
                ok = r.status_code == 413 and _is_error(r.text, (413,))
                tally.add("failed" if ok else "wrong", None if ok else f"{r.status_code}")
            except httpx.HTTPError:  # the server closed the upload after its 413: refused
                tally.add("failed")
            windows.append((start, time.monotonic()))
            await asyncio.sleep(0.2)


async def health_probe(url: str, until: float | threading.Event, samples: list) -> None:
    """/health every 20 ms from a thread of its own (so the soak's own busy event loop does not
    add to the latency measured), until a time or an event: (time sent, latency s, status) into
    `samples`."""
    await asyncio.to_thread(_probe_health, url, until, samples)


def _probe_health(url: str, until: float | threading.Event, samples: list) -> None:
    def going() -> bool:
        return not until.is_set() if isinstance(until, threading.Event) \
            else time.monotonic() < until

    with httpx.Client(base_url=url, timeout=10) as c:
        while going():
            start = time.monotonic()
            try:
                status = c.get("/health").status_code
            except httpx.HTTPError:
                status = 0
            samples.append((start, time.monotonic() - start, status))
            time.sleep(0.02)


async def stop_and_continue(pid: int, at: float, stop_s: float) -> None:
    await asyncio.sleep(max(at - time.monotonic(), 0))
    os.kill(pid, signal.SIGSTOP)
    await asyncio.sleep(stop_s)
    os.kill(pid, signal.SIGCONT)


def kv_in_use(url: str) -> int:
    """KV blocks held now (kv_cache_usage_perc of the usable blocks)."""
    return round(metric(url, "kv_cache_usage_perc") * (NUM_BLOCKS - 1))


def wait_idle(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(metric(url, f"num_requests_{state}")
                   for state in ("running", "waiting", "swapped")):
            return
        time.sleep(0.2)


# -- the phases ---------------------------------------------------------------------------------
def load_phase(args, work: Path) -> dict:
    tally, samples, windows = Tally(), [], []
    with ServerProcess([*ENGINE, f"core_timeout_s={args.core_timeout}"],
                       log=work / "load.log") as srv:
        async def run() -> None:
            until = time.monotonic() + args.seconds
            await asyncio.gather(
                *(client_loop(srv.url, i, until, tally, args.request_timeout)
                  for i in range(args.clients)),
                big_bodies(srv.url, until, tally, windows),
                health_probe(srv.url, until, samples),
                stop_and_continue(srv.core_pid(), time.monotonic() + args.seconds / 2,
                                  args.stop_s))

        asyncio.run(run())
        wait_idle(srv.url)
        leaked = kv_in_use(srv.url)
    during = [lat for t, lat, _ in samples if any(a <= t <= b for a, b in windows)]
    every = [lat for _, lat, _ in samples]
    bad_health = sum(1 for _, _, status in samples if status != 200)
    return {"tally": tally, "kv_blocks_leaked": leaked,
            "health_max_ms_during_big_bodies": 1000 * max(during, default=float("nan")),
            "health_p99_ms_during_big_bodies": 1000 * _p99(during),
            "health_samples_during_big_bodies": len(during),
            "health_p99_ms_all": 1000 * _p99(every),
            "health_not_200": bad_health}


def _p99(xs: list[float]) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def death_phase(args, work: Path, name: str) -> dict:
    """kill (kill -9 of the core) or hang (SIGSTOP past core_timeout_s) with requests in
    flight: every request fails with 503, the server exits non-zero by itself."""
    tally = Tally()
    tmp = Path(tempfile.mkdtemp(dir=work))
    with ServerProcess([*ENGINE, f"core_timeout_s={args.core_timeout}"],
                       env={"TMPDIR": str(tmp)}, log=work / f"{name}.log") as srv:
        health: list = []

        async def run() -> None:
            done = threading.Event()
            clients = [asyncio.ensure_future(
                _in_flight(srv.url, i, tally, args.request_timeout)) for i in range(8)]
            await asyncio.sleep(0.3)
            pid = srv.core_pid()
            os.kill(pid, signal.SIGKILL if name == "kill" else signal.SIGSTOP)
            probe = asyncio.ensure_future(health_probe(srv.url, done, health))
            await asyncio.gather(*clients)
            done.set()
            await probe

        asyncio.run(run())
        code = srv.wait(60)
    return {"tally": tally, "server_exit_code": code,
            "health_503_seen": any(s == 503 for _, _, s in health),
            "ipc_dirs_left": len(list(tmp.glob("lab-core-*")))}


async def _in_flight(url: str, seed: int, tally: Tally, timeout: float) -> None:
    """One long request (streaming or not) that the fault will end."""
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=None) as c:
        body = {"prompt": rng.choice(PROMPTS), "max_tokens": 240, "ignore_eos": True,
                "stream": seed % 2 == 0}
        work = _streamed(c, body, (503,)) if body["stream"] else _plain(c, body, (503,))
        try:  # (one that finished before the fault reached it is ok: nothing was lost)
            tally.add(*await asyncio.wait_for(work, timeout))
        except TimeoutError:
            tally.add("hung", f"no answer within {timeout} s")
        except httpx.HTTPError as e:
            tally.add("failed", f"{type(e).__name__}")


def cancel_phase(args, work: Path) -> dict:
    """The heaviest plain request there is (n at the cap, ignore_eos) whose client leaves after
    3 s: how long until lab:generation_tokens_total stops growing, and how long a short request
    sent next waits."""
    tally = Tally()
    with ServerProcess(ENGINE, log=work / "cancel.log") as srv:
        body = {"prompt": "hi", "n": 16384, "max_tokens": 64, "ignore_eos": True}
        before = _generated(srv.url)
        try:
            httpx.post(srv.url + "/v1/completions", json=body, timeout=3.0)
            tally.add("wrong", "answered within 3 s")
        except httpx.ReadTimeout:
            tally.add("left")
        left = time.monotonic()
        last_growth, last = left, _generated(srv.url)
        while_waiting = last - before
        while time.monotonic() - last_growth < 1.0 and time.monotonic() - left < 60:
            time.sleep(0.05)
            now = _generated(srv.url)
            if now != last:
                last_growth, last = time.monotonic(), now
        start = time.monotonic()
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 8},
                       timeout=args.request_timeout)
        tally.add("ok" if r.status_code == 200 else "wrong")
        return {"tally": tally, "tokens_in_the_3_s": int(while_waiting),
                "tokens_after_leaving": int(last - before - while_waiting),
                "generation_stopped_after_s": last_growth - left,
                "next_request_s": time.monotonic() - start}


def _generated(url: str) -> float:
    return metric(url, "generation_tokens_total")


def sigterm_phase(args, work: Path) -> dict:
    tally = Tally()
    tmp = Path(tempfile.mkdtemp(dir=work))
    grace = 2.0
    with ServerProcess([*ENGINE, "--shutdown-timeout", str(grace)], env={"TMPDIR": str(tmp)},
                       log=work / "sigterm.log") as srv:
        async def run() -> float:
            clients = [asyncio.ensure_future(client_loop(
                srv.url, i, time.monotonic() + 600, tally, args.request_timeout))
                for i in range(4)]
            await asyncio.sleep(1.0)
            srv.proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            await asyncio.to_thread(srv.wait, 60)
            exited = time.monotonic() - sent
            for c in clients:
                c.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
            return exited

        exit_s = asyncio.run(run())
        code = srv.proc.returncode
    return {"tally": tally, "server_exit_code": code, "exit_s": exit_s, "grace_s": grace,
            "ipc_dirs_left": len(list(tmp.glob("lab-core-*")))}


def report(results: dict) -> list[str]:
    """The table: per phase, requests sent / ok / failed right / wrong / hung, and checks."""
    lines = [f"{'phase':<8} {'sent':>6} {'ok':>6} {'left':>6} {'failed':>7} {'refused':>7} "
             f"{'wrong':>6} {'hung':>5}  checks"]
    for name, r in results.items():
        t = r["tally"].outcomes
        checks = {k: v for k, v in r.items() if k != "tally"}
        lines.append(f"{name:<8} {sum(t.values()):>6} {t['ok']:>6} {t['left']:>6} "
                     f"{t['failed']:>7} {t['refused']:>7} {t['wrong']:>6} {t['hung']:>5}  "
                     + ", ".join(f"{k}={_fmt(v)}" for k, v in checks.items()))
    return lines


def _fmt(v) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def verdict(results: dict) -> list[str]:
    """What the soak requires that did not hold (empty: all held)."""
    bad = []
    for name, r in results.items():
        t = r["tally"].outcomes
        if t["hung"] or t["wrong"]:
            bad.append(f"{name}: {t['hung']} hung, {t['wrong']} wrong ({r['tally'].notes[:3]})")
    cancel = results.get("cancel")
    if cancel and not cancel["generation_stopped_after_s"] < 1.0:
        bad.append(f"cancel: generation went on {cancel['generation_stopped_after_s']:.1f} s "
                   f"after the client left (target < 1 s)")
    load = results.get("load")
    if load and load["kv_blocks_leaked"]:
        bad.append(f"load: {load['kv_blocks_leaked']} KV blocks leaked")
    if load and not load["health_p99_ms_during_big_bodies"] < 100:
        bad.append(f"load: /health p99 {load['health_p99_ms_during_big_bodies']:.1f} ms "
                   f"during 50 MB bodies (target < 100)")
    for name in ("kill", "hang"):
        r = results.get(name)
        if r and (r["server_exit_code"] in (None, 0) or r["ipc_dirs_left"]):
            bad.append(f"{name}: server exit {r['server_exit_code']}, "
                       f"{r['ipc_dirs_left']} IPC dirs left")
    term = results.get("sigterm")
    if term and (term["server_exit_code"] != 0 or term["ipc_dirs_left"]
                 or term["exit_s"] > term["grace_s"] + 15):
        bad.append(f"sigterm: exit {term['server_exit_code']} after {term['exit_s']:.1f} s, "
                   f"{term['ipc_dirs_left']} IPC dirs left")
    return bad


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0, help="length of the load phase")
    p.add_argument("--clients", type=int, default=8, help="concurrent client loops")
    p.add_argument("--stop-s", type=float, default=1.0,
                   help="how long the core is stopped during the load (< --core-timeout)")
    p.add_argument("--core-timeout", type=float, default=4.0,
                   help="the servers' core_timeout_s (the hang phase stops the core longer)")
    p.add_argument("--request-timeout", type=float, default=60.0,
                   help="a request with no answer after this long counts as hung")
    p.add_argument("--phases", default="load,cancel,kill,hang,sigterm")
    p.add_argument("--result-json", type=Path, default=None)
    return p


def main(argv: Sequence[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if not args.stop_s < args.core_timeout:
        raise SystemExit("--stop-s must be shorter than --core-timeout (the load phase's stop "
                         "must be survived)")
    phases = {"load": load_phase, "cancel": cancel_phase, "kill": lambda a, w: death_phase(a, w, "kill"),
              "hang": lambda a, w: death_phase(a, w, "hang"), "sigterm": sigterm_phase}
    chosen = [p for p in args.phases.split(",") if p]
    unknown = [p for p in chosen if p not in phases]
    if unknown:
        raise SystemExit(f"--phases: unknown {unknown}; choose from {', '.join(phases)}")
    results = {}
    work = Path(tempfile.mkdtemp(prefix="lab-soak-"))
    for name in chosen:
        print(f"phase {name} ...", flush=True)
        results[name] = phases[name](args, work)
    for line in report(results):
        print(line)
    bad = verdict(results)
    if bad:
        print("FAIL (the servers' logs are in " + str(work) + "):\n  " + "\n  ".join(bad))
    else:
        print("PASS")
        shutil.rmtree(work, ignore_errors=True)
    if args.result_json:
        args.result_json.write_text(json.dumps(
            {k: {**v, "tally": dict(v["tally"].outcomes), "notes": v["tally"].notes}
             for k, v in results.items()}, indent=2, default=str))
    if bad:
        raise SystemExit(1)
    return {k: asdict(v["tally"]) for k, v in results.items()}


if __name__ == "__main__":
    main()
