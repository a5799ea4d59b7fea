"""Stateful property test: BlockPool + KVCacheManager against a plain list-and-dict model.

Requests draw tokens from a two-letter vocabulary so prefixes are shared often; the pool is
small so allocations evict cached blocks and fail under pressure.
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lab.cache import KVCacheManager, make_block_hasher
from lab.core.request import Request
from lab.core.sampling_params import SamplingParams
from tests.cache.snapshots import snapshot

BS, NUM_BLOCKS, MAX_LEN = 2, 8, 16


class Model:
    """The expected state, kept with plain lists: free order, refs, hashes, hash map, owners."""

    def __init__(self) -> None:
        self.free = list(range(1, NUM_BLOCKS))
        self.ref = [0] * NUM_BLOCKS
        self.hash: list[bytes | None] = [None] * NUM_BLOCKS
        self.cached: dict[bytes, list[int]] = {}
        self.owned: dict[str, list[int]] = {}
        self.num_cached: dict[str, int] = {}
        self.evicted = 0
        self.stats = [0, 0, 0]  # requests, queries, hits

    def lookup(self, req: Request) -> list[int]:
        hits = []
        for h in req.block_hashes[: (req.num_tokens - 1) // BS]:
            if not self.cached.get(h):
                break
            hits.append(self.cached[h][0])
        self.stats = [self.stats[0] + 1, self.stats[1] + req.num_tokens,
                      self.stats[2] + len(hits) * BS]
        return hits

    def allocate(self, req: Request, n_new: int, n_hit: int, hits: list[int]) -> list[int] | None:
        rid, blocks = req.request_id, self.owned.get(req.request_id, [])
        computed = req.num_computed_tokens + n_hit
        need = -(-min(computed + n_new, MAX_LEN) // BS) - len(blocks) - len(hits)
        if max(need, 0) + sum(self.ref[b] == 0 for b in hits) > len(self.free):
            return None
        for b in hits:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        if hits:
            self.num_cached[rid] = len(hits)
        new = [self._pop() for _ in range(max(need, 0))]
        self.owned[rid] = blocks + hits + new
        return new

    def computed(self, req: Request) -> None:
        """The step ran: blocks full of computed tokens join the prefix cache."""
        self._cache(req, min(req.num_computed_tokens, req.num_tokens) // BS)

    def _pop(self) -> int:
        b = self.free.pop(0)
        if self.hash[b] is not None:
            self.cached[self.hash[b]].remove(b)
            self.hash[b] = None
            self.evicted += 1
        self.ref[b] = 1
        return b

    def _cache(self, req: Request, num_full: int) -> None:
        blocks, start = self.owned[req.request_id], self.num_cached.get(req.request_id, 0)
        for i in range(start, min(num_full, len(blocks))):
            self.hash[blocks[i]] = req.block_hashes[i]
            self.cached.setdefault(req.block_hashes[i], []).append(blocks[i])
        self.num_cached[req.request_id] = max(start, min(num_full, len(blocks)))

    def free_request(self, rid: str) -> None:
        for b in reversed(self.owned.pop(rid, [])):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)
        self.num_cached.pop(rid, None)

    def reset(self) -> bool:
        if len(self.free) != NUM_BLOCKS - 1:
            return False
        self.hash = [None] * NUM_BLOCKS
        self.cached = {}
        return True


pick = st.integers(0, 1000)


class KVCacheMachine(RuleBasedStateMachine):
    """Drives the manager like a scheduler: admit, step (prefill chunks / decode), free, preempt."""

    def __init__(self) -> None:
        super().__init__()
        self.m = KVCacheManager(NUM_BLOCKS, BS, MAX_LEN, enable_caching=True)
        self.model = Model()
        self.hasher = make_block_hasher(BS)
        self.waiting: dict[str, Request] = {}
        self.running: dict[str, Request] = {}
        self.next_id = 0
        self.next_token = 0  # the token "sampled" when a request finishes its prefill chunk

    def _choose(self, reqs: dict[str, Request], i: int) -> Request:
        return reqs[sorted(reqs)[i % len(reqs)]]

    def _allocate(self, req: Request, n_new: int, hits: list, n_hit: int) -> bool:
        """Allocate in both implementation and model; compare; on failure check no change."""
        before = snapshot(self.m)
        expected = self.model.allocate(req, n_new, n_hit, [b.block_id for b in hits])
        got = self.m.allocate_slots(req, n_new, n_hit, (hits,))  # one KV cache group
        if got is None:
            event("allocation failed")
            assert expected is None
            assert snapshot(self.m) == before
            return False
        assert [b.block_id for b in got[0]] == expected
        event(f"allocation evicted cached blocks: {self.m.block_pool.total_evicted > before[-1]}")
        req.num_computed_tokens += n_hit + n_new
        self.m.cache_computed(req)
        self.model.computed(req)
        if req.num_computed_tokens == req.num_tokens:
            req.append_output_token(self.next_token)  # the sampled token of this step
        return True

    def _admit(self, req: Request, frac: float, tok: int) -> None:
        """Prefix lookup then allocate a chunk (all, or part, of what is owed)."""
        (hits,), n_hit = self.m.get_computed_blocks(req)
        assert [b.block_id for b in hits] == self.model.lookup(req)
        assert n_hit == len(hits) * BS <= req.num_tokens - 1
        event(f"admit with hits: {bool(hits)}")
        self.next_token = tok
        if self._allocate(req, max(1, round(frac * (req.num_tokens - n_hit))), hits, n_hit):
            self.running[req.request_id] = req
            self.waiting.pop(req.request_id, None)
        else:
            self.waiting[req.request_id] = req

    @rule(tokens=st.lists(st.integers(0, 1), min_size=1, max_size=14), frac=st.floats(0, 1),
          tok=st.integers(0, 1))
    def add_request(self, tokens: list[int], frac: float, tok: int) -> None:
        """A new request arrives and is admitted at once if its blocks fit (else it waits)."""
        rid = f"r{self.next_id}"
        self.next_id += 1
        req = Request(rid, tokens, SamplingParams(), None, 0.0, block_hasher=self.hasher)
        self._admit(req, frac, tok)

    @precondition(lambda self: self.waiting)
    @rule(i=pick, frac=st.floats(0, 1), tok=st.integers(0, 1))
    def readmit(self, i: int, frac: float, tok: int) -> None:
        """Retry a waiting (preempted or refused) request."""
        self._admit(self._choose(self.waiting, i), frac, tok)

    @precondition(lambda self: self.running)
    @rule(i=pick, frac=st.floats(0, 1), tok=st.integers(0, 1))
    def step(self, i: int, frac: float, tok: int) -> None:
        """One scheduling step of a running request: a prefill chunk or one decode token."""
        req = self._choose(self.running, i)
        if req.num_tokens >= MAX_LEN:
            self._finish(req)
            return
        owed = req.num_tokens - req.num_computed_tokens
        self.next_token = tok
        self._allocate(req, max(1, round(frac * owed)), [], 0)

    def _finish(self, req: Request) -> None:
        self.m.free(req)
        self.model.free_request(req.request_id)
        del self.running[req.request_id]

    @precondition(lambda self: self.running)
    @rule(i=pick)
    def finish(self, i: int) -> None:
        self._finish(self._choose(self.running, i))

    @precondition(lambda self: self.running)
    @rule(i=pick)
    def preempt(self, i: int) -> None:
        """Recompute-preemption: free everything; the request waits to be re-admitted."""
        req = self._choose(self.running, i)
        self._finish(req)
        req.num_computed_tokens = 0
        self.waiting[req.request_id] = req

    @rule()
    def reset_prefix_cache(self) -> None:
        assert self.m.reset_prefix_cache() == self.model.reset() == (not self.running)

    @rule()
    def take_stats(self) -> None:
        stats = self.m.take_prefix_cache_stats()
        assert [stats.requests, stats.queries, stats.hits] == self.model.stats
        self.model.stats = [0, 0, 0]
        assert self.m.take_num_evicted() == self.model.evicted
        self.model.evicted = 0

    @invariant()
    def matches_model(self) -> None:
        pool, model = self.m.block_pool, self.model
        assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == model.free
        assert [b.ref_cnt for b in pool.blocks[1:]] == model.ref[1:]
        assert [b.block_hash for b in pool.blocks] == model.hash
        assert {r: self.m.get_block_ids(r)[0] for r in self.m.coordinator.request_ids()} == \
            model.owned

    @invariant()
    def blocks_conserved_and_refs_match_owners(self) -> None:
        pool = self.m.block_pool
        in_use = [b for b in pool.blocks[1:] if b.ref_cnt > 0]
        assert pool.num_free_blocks + len(in_use) == NUM_BLOCKS - 1
        owners = [0] * NUM_BLOCKS
        for rid in self.running:
            for bid in self.m.get_block_ids(rid)[0]:
                owners[bid] += 1
        assert [b.ref_cnt for b in pool.blocks[1:]] == owners[1:]
        assert set(self.m.coordinator.request_ids()) == set(self.running)
        assert 0.0 <= self.m.usage <= 1.0

    @invariant()
    def free_queue_iff_unreferenced(self) -> None:
        queue = self.m.block_pool.free_block_queue
        free = queue.get_all_free_blocks()
        assert len(free) == queue.num_free_blocks
        prev = queue.fake_head
        for b in free:
            assert b.prev_free_block is prev and not b.is_null
            prev = b
        assert queue.fake_tail.prev_free_block is prev
        free_ids = {b.block_id for b in free}
        for b in self.m.block_pool.blocks[1:]:
            assert (b.block_id in free_ids) == (b.ref_cnt == 0)

    @invariant()
    def hash_map_consistent(self) -> None:
        pool = self.m.block_pool
        entries = pool.cached_block_hash_to_block.items()
        assert all(b.block_hash == key and not b.is_null for key, b in entries)
        hashed = {(b.block_hash, b.block_id) for b in pool.blocks if b.block_hash is not None}
        assert {(k, b.block_id) for k, b in entries} == hashed and len(entries) == len(hashed)
        for rid, req in self.running.items():
            manager = self.m.coordinator.managers[0]
            blocks = manager.req_to_blocks[rid]
            n = manager.num_cached_block.get(rid, 0)
            assert [b.block_hash for b in blocks[:n]] == req.block_hashes[:n]


KVCacheMachine.TestCase.settings = settings(stateful_step_count=40)
TestKVCacheMachine = KVCacheMachine.TestCase
