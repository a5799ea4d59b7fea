"""Queue policies: order, ties, victim and preempt_for choices, knobs; end to end with a fake model."""

import pytest

from lab.cache.hashing import make_block_hasher
from lab.core.request import Request
from lab.core.sampling_params import SamplingParams
from lab.scheduler.queues import FairQueue, FCFSQueue, PriorityQueue, RequestQueue, SJFQueue
from tests.options import build, options
from tests.scheduler.fakes import (
    EOS,
    expected_output,
    fake_execute,
    make_scheduler,
    run_to_completion,
)


def req(rid, priority=0, arrival=0.0, prompt=4, max_tokens=4, client=None, computed=0, outputs=0):
    r = Request(rid, list(range(1, prompt + 1)), SamplingParams(max_tokens=max_tokens), EOS,
                arrival_time=arrival, priority=priority, client_id=client)
    r.num_computed_tokens = computed
    for _ in range(outputs):
        r.append_output_token(7)
    return r


def ids(reqs):
    return [r.request_id for r in reqs]


def drain(q):
    return [q.pop().request_id for _ in range(len(q))]


POLICIES = options("scheduler")  # every lab/conf/scheduler/*.yaml


def make_queue(name: str, **knobs) -> RequestQueue:
    """The policy as `scheduler=<name>` builds it (yaml defaults + `knobs`)."""
    return build("scheduler", name, **knobs)


# -- common behaviour ------------------------------------------------------------------------
@pytest.mark.parametrize("name", POLICIES)
def test_basic_contract(name):
    """add/peek/pop/remove/len/iter agree with a plain list of the waiting requests; with equal
    priorities, clients and lengths every policy serves by arrival; preempt_for preempts only
    for a waiting request strictly more important than the victim (priority), else None."""
    q = make_queue(name)
    assert not q and len(q) == 0
    a, b, c = req("a", arrival=1), req("b", arrival=2), req("c", arrival=3)
    for r in (a, b, c):
        q.add(r)
    assert len(q) == 3 and q.peek() is a and ids(q) == ["a", "b", "c"]
    q.remove(b)
    assert ids(q) == ["a", "c"] and len(q) == 2 and b not in list(q)
    assert q.pop() is a and q.peek() is c and len(q) == 1
    assert q.preempt_for(c, [a]) is None  # equally important: nobody preempts
    urgent = req("u", priority=-1, arrival=4)
    assert q.preempt_for(urgent, [a]) is (a if isinstance(q, PriorityQueue) else None)
    assert q.preempt_for(urgent, []) is None
    q.on_step(123.0)
    q.on_scheduled(a, 4, 0)
    with pytest.raises((ValueError, IndexError)):
        q.remove(b)
    assert q.pop() is c and not q
    with pytest.raises(IndexError):
        q.peek()


@pytest.mark.parametrize("name", POLICIES)
def test_ties_by_request_id_are_deterministic(name):
    q = make_queue(name)
    for rid in ["r2", "r0", "r1"]:  # equal priority, arrival and length
        q.add(req(rid, priority=1, arrival=5.0))
    order = drain(q)
    # FCFS (and a policy built on it) keeps arrival order, which ties here: insertion order
    assert order == (["r2", "r0", "r1"] if isinstance(q, FCFSQueue) else ["r0", "r1", "r2"])


def test_fcfs_hooks_are_no_ops_and_prepend_goes_first():
    q = FCFSQueue()
    a, b = req("a"), req("b")
    q.add(a)
    q.prepend(b)
    assert q.preempt_for(a, [b]) is None
    assert drain(q) == ["b", "a"] and FCFSQueue().victim([a, b]) is b


# -- priority --------------------------------------------------------------------------------
def test_priority_order_remove_and_prepend():
    q = PriorityQueue()
    reqs = [req("low", 5, 1.0), req("hi_late", 0, 3.0), req("hi", 0, 2.0), req("mid", 2, 0.0)]
    for r in reqs:
        q.add(r)
    assert ids(q) == ["hi", "hi_late", "mid", "low"]
    q.remove(reqs[2])
    assert q.peek().request_id == "hi_late"
    q.prepend(reqs[2])  # back to its place by key
    q.prepend(req("mid2", 2, 9.0))
    assert drain(q) == ["hi", "hi_late", "mid", "mid2", "low"]
    with pytest.raises(IndexError):
        q.peek()


def test_priority_remove_readd_and_compaction():
    q = PriorityQueue()
    rs = [req(f"r{i:03d}", priority=i % 3, arrival=i) for i in range(300)]
    for r in rs:
        q.add(r)
    for r in rs[:250]:
        q.remove(r)
    assert len(q._heap) <= 2 * len(q) + 64 + 1
    q.add(rs[0])
    q.remove(rs[0])
    q.add(rs[0])  # re-added after removal: exactly one live copy
    expected = sorted(rs[250:] + [rs[0]], key=Request.sort_key)
    assert ids(q) == ids(expected) and drain(q) == ids(expected)


def test_priority_victim_and_preempt_for():
    q = PriorityQueue()
    a, b, c = req("a", 1, 1.0), req("b", 3, 1.0), req("c", 3, 2.0)
    assert q.victim([c, a, b]) is c  # largest priority value, latest arrival
    assert q.preempt_for(req("w", 2), [a, b, c]) is c
    assert q.preempt_for(req("w", 3), [a, b, c]) is None  # equal priority: no preemption
    assert q.preempt_for(req("w", 0), [a]) is a
    assert q.preempt_for(req("w", 0), []) is None


# -- sjf -------------------------------------------------------------------------------------
def test_sjf_shortest_remaining_first():
    q = SJFQueue()
    long = req("long", prompt=20, max_tokens=20)
    short = req("short", prompt=2, max_tokens=2, arrival=5.0)
    half = req("half", prompt=20, max_tokens=10, computed=20, outputs=6)  # 0 + 4 left
    for r in (long, short, half):
        q.add(r)
    assert ids(q) == ["half", "short", "long"]
    assert q.victim([short, long, half]) is long
    assert q.preempt_for(short, [long]) is None


def test_sjf_aging_puts_an_old_long_request_first():
    q = SJFQueue(aging_bound_s=10.0)
    old_long = req("old_long", prompt=50, max_tokens=50, arrival=0.0)
    older_long = req("older_long", prompt=60, max_tokens=50, arrival=-0.005)
    q.add(old_long)
    q.add(older_long)
    q.add(req("new_short", prompt=1, max_tokens=1, arrival=9.0))
    assert q.peek().request_id == "new_short"  # before any on_step nothing has aged
    q.on_step(9.99)
    assert q.peek().request_id == "new_short"
    q.on_step(10.0)  # old_long reaches the bound exactly; older_long is past it
    assert drain(q) == ["older_long", "old_long", "new_short"]


def test_sjf_victim_ties_latest_sort_key():
    a, b = req("a", arrival=1.0), req("b", arrival=2.0)
    assert SJFQueue().victim([b, a]) is b


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "10", None, True])
def test_sjf_rejects_bad_aging_bound(bad):
    with pytest.raises(ValueError, match="aging_bound_s"):
        SJFQueue(aging_bound_s=bad)


# -- fair ------------------------------------------------------------------------------------
def test_fair_light_client_goes_first_after_accounting():
    q = FairQueue(prefill_weight=1.0, decode_weight=2.0)
    heavy_running = req("h0", client="heavy")
    q.on_scheduled(heavy_running, 100, 0)
    q.on_scheduled(heavy_running, 0, 10)
    assert q.counters["heavy"] == 120.0
    q.add(req("h1", client="heavy", arrival=1.0))
    q.add(req("l1", client="light", arrival=2.0))  # lifted to min waiting = 120: a tie
    assert q.counters["light"] == 120.0 and q.peek().request_id == "h1"
    q.on_scheduled(heavy_running, 0, 1)  # heavy is served again
    assert drain(q) == ["l1", "h1"]


def test_fair_lift_on_return_only_when_client_has_nothing_waiting():
    q = FairQueue()
    a1, a2 = req("a1", client="a", arrival=1.0), req("a2", client="a", arrival=2.0)
    q.add(req("anon", arrival=0.0))  # None is a client too
    q.on_scheduled(a1, 50, 0)
    q.on_scheduled(req("x"), 30, 0)  # anonymous client: 30
    q.add(a1)  # a has nothing waiting; min waiting counter (anon) is 30 < 50: no change
    assert q.counters["a"] == 50.0
    q.add(req("b1", client="b", arrival=3.0))  # b never served: lifted to min(30, 50)
    assert q.counters["b"] == 30.0
    q.on_scheduled(req("b0", client="b"), 100, 0)  # b: 130
    q.add(a2)  # a already has a waiting request: no lift
    assert q.counters["a"] == 50.0
    assert drain(q) == ["anon", "a1", "a2", "b1"]
    q.add(req("c1", client="c"))  # nothing waiting anywhere: no lift
    assert q.counters.get("c", 0.0) == 0.0


def test_fair_prepend_does_not_lift_and_remove_keeps_counts():
    q = FairQueue()
    q.on_scheduled(req("a0", client="a"), 10, 0)
    q.add(req("a1", client="a"))
    b = req("b1", client="b")
    q.prepend(b)  # a preempted request comes back: not an arrival, no lift
    assert q.counters.get("b", 0.0) == 0.0 and q.peek() is b
    q.remove(b)
    q.add(req("b2", client="b"))  # b has nothing waiting again: lifted to a's 10
    assert q.counters["b"] == 10.0


def test_fair_victim_is_from_the_most_served_client():
    q = FairQueue()
    a1, a2, b1 = req("a1", client="a", arrival=1.0), req("a2", client="a", arrival=2.0), \
        req("b1", client="b", arrival=3.0)
    q.on_scheduled(a1, 10, 0)
    q.on_scheduled(b1, 5, 0)
    assert q.victim([a2, b1, a1]) is a2
    assert q.preempt_for(b1, [a1, a2]) is None


@pytest.mark.parametrize("kwargs,field", [
    ({"prefill_weight": -1.0}, "prefill_weight"),
    ({"decode_weight": float("nan")}, "decode_weight"),
    ({"decode_weight": "2"}, "decode_weight"),
    ({"prefill_weight": 0, "decode_weight": 0}, "prefill_weight"),
])
def test_fair_rejects_bad_weights(kwargs, field):
    with pytest.raises(ValueError, match=field):
        FairQueue(**kwargs)


# -- config and end to end -------------------------------------------------------------------
@pytest.mark.parametrize("name", POLICIES)
def test_yaml_instantiates(name):
    q = make_queue(name)
    assert isinstance(q, RequestQueue) and q.name == name


def _submit(s, rid, prompt, max_tokens, priority, client):
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    r = Request(rid, prompt, sp, EOS, arrival_time=s.clock(), priority=priority, client_id=client,
                block_hasher=make_block_hasher(s.kv.block_size))
    s.add_request(r)
    return r


KNOBS = {"sjf": {"aging_bound_s": 0.01}}  # ages within the run: both of sjf's orders are used


@pytest.mark.parametrize("name", POLICIES)
def test_workload_completes_with_exact_outputs(name):
    # A tiny cache forces preemption; mixed priorities, clients and lengths exercise each order.
    s = make_scheduler(num_blocks=10, block_size=4, max_num_seqs=3, budget=12, max_model_len=32,
                       queue=make_queue(name, **KNOBS.get(name, {})))
    reqs, preempted = [], set()
    for i in range(12):
        prompt = [(i * 7 + j) % 9 + 1 for j in range(3 + (i * 5) % 11)]
        reqs.append(_submit(s, f"q{i:02d}", prompt, 2 + (i * 3) % 9, priority=(i * 2) % 3,
                            client=f"c{i % 3}" if i % 4 else None))
        if i % 4 == 3:  # a few steps between arrival waves
            for _ in range(3):
                s.update_from_output(out := s.schedule(), fake_execute(s, out))
    run_to_completion(s, on_step=lambda out: preempted.update(out.preempted_req_ids))
    assert preempted  # the cache was small enough to force preemption
    for r in reqs:
        assert r.finish_reason == "length"
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
    assert not s.waiting and s.kv.num_free_blocks == s.kv.num_blocks - 1
