"""Stateful property test of the hybrid KV cache: a KVCacheManager over a full-attention group
and two sliding-window groups, driven like a scheduler (admit with prefix hits, chunked steps,
decode, finish, recompute preemption, swap out and resume, taken-back resumes, cache resets).

Besides the pool's bookkeeping (every block's reference count is the number of lists holding
it, per group; the free queue holds exactly the unreferenced blocks; no block is leaked or
freed twice), a content model checks what matters: every step writes its tokens into the
blocks of every group, swaps copy block contents, and after each operation every running
request reads back exactly its own tokens from each group — all of them in the full group,
its window in a sliding one. So a prefix hit that is invalid for some group, a window that
freed a block still read, or a wrong swap target fails here.
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lab.cache import KVCacheManager, make_block_hasher
from lab.cache.groups import FULL, SLIDING_WINDOW, KVCacheGroup, KVCacheGroupSpec
from lab.cache.hashing import group_key
from lab.core.request import Request
from lab.core.sampling_params import SamplingParams

BS, NUM_BLOCKS, MAX_LEN, WINDOWS = 2, 24, 24, (3, 5)
GROUPS = (KVCacheGroup(FULL, (1,)),
          *(KVCacheGroup(KVCacheGroupSpec(SLIDING_WINDOW, w), (i * 2,)) for i, w in
            enumerate(WINDOWS)))
pick = st.integers(0, 1000)


class HybridMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheManager(NUM_BLOCKS, BS, MAX_LEN, swap_space_gb=1e-5, bytes_per_block=64,
                                 groups=GROUPS)
        self.hasher = make_block_hasher(BS)
        self.device: dict[int, list[int | None]] = {}  # block id -> the token at each slot
        self.cpu: dict[int, list[int | None]] = {}
        self.waiting: dict[str, Request] = {}
        self.running: dict[str, Request] = {}
        self.swapped: dict[str, Request] = {}
        self.next_id = 0

    # -- helpers -------------------------------------------------------------------------------
    def _choose(self, reqs: dict[str, Request], i: int) -> Request:
        return reqs[sorted(reqs)[i % len(reqs)]]

    def _apply_swaps(self) -> None:
        step = self.kv.take_swap_step()
        for dev, cpu in step.swap_out:
            self.cpu[cpu] = list(self.device.get(dev, [None] * BS))
        for cpu, dev in step.swap_in:
            self.device[dev] = list(self.cpu[cpu])

    def _run_step(self, req: Request, n: int) -> None:
        """The step computes n tokens of `req`: written into every group's blocks."""
        self._apply_swaps()
        start = req.num_computed_tokens
        self._check_reads(req)  # the step's first query reads these keys
        for blocks in self.kv.get_block_ids(req.request_id):
            for pos in range(start, start + n):
                assert blocks[pos // BS] != 0, "a step writes the null block"
                self.device.setdefault(blocks[pos // BS], [None] * BS)[pos % BS] = \
                    req.all_token_ids[pos]
        req.num_computed_tokens += n
        self.kv.cache_computed(req)
        if req.num_computed_tokens == req.num_tokens and req.num_tokens < MAX_LEN:
            req.append_output_token(req.num_tokens % 3)  # the sampled token

    def _schedule(self, req: Request, frac: float) -> bool:
        """A waiting request's first chunk, from the prefix cache: False when it does not fit."""
        hits, num_hit = self.kv.get_computed_blocks(req)
        assert num_hit % BS == 0 and num_hit <= req.num_tokens - 1
        assert all(len(h) == num_hit // BS for h in hits)
        event(f"prefix hit: {num_hit > 0}")
        n = max(1, round(frac * (req.num_tokens - num_hit)))
        if self.kv.allocate_slots(req, n, num_hit, hits) is None:
            return False
        req.num_computed_tokens += num_hit
        self._run_step(req, n)
        return True

    # -- rules ---------------------------------------------------------------------------------
    @rule(tokens=st.lists(st.integers(0, 1), min_size=1, max_size=18), frac=st.floats(0, 1))
    def add_request(self, tokens, frac):
        rid = f"r{self.next_id}"
        self.next_id += 1
        req = Request(rid, tokens, SamplingParams(), None, 0.0, block_hasher=self.hasher)
        (self.running if self._schedule(req, frac) else self.waiting)[rid] = req

    @precondition(lambda self: self.waiting)
    @rule(i=pick, frac=st.floats(0, 1))
    def admit_waiting(self, i, frac):
        req = self._choose(self.waiting, i)
        if self._schedule(req, frac):
            self.running[req.request_id] = self.waiting.pop(req.request_id)

    @precondition(lambda self: self.running)
    @rule(i=pick, frac=st.floats(0, 1))
    def step(self, i, frac):
        req = self._choose(self.running, i)
        owed = req.num_tokens - req.num_computed_tokens
        if owed == 0 or req.num_tokens >= MAX_LEN:
            self.finish(i)
            return
        n = max(1, round(frac * owed))
        if self.kv.allocate_slots(req, n) is None:
            event("step did not fit")
            return
        self._run_step(req, n)

    @precondition(lambda self: self.running)
    @rule(i=pick)
    def finish(self, i):
        req = self._choose(self.running, i)
        self.kv.release(req)
        del self.running[req.request_id]

    @precondition(lambda self: self.running)
    @rule(i=pick)
    def preempt_recompute(self, i):
        req = self._choose(self.running, i)
        self.kv.free(req)
        req.num_computed_tokens = 0
        self.waiting[req.request_id] = self.running.pop(req.request_id)

    @precondition(lambda self: self.running)
    @rule(i=pick)
    def swap_out(self, i):
        req = self._choose(self.running, i)
        if not self.kv.swap_out(req):
            event("swap out refused")
            return
        self._apply_swaps()  # the copies run before anything reuses the freed blocks
        self.swapped[req.request_id] = self.running.pop(req.request_id)

    @precondition(lambda self: self.swapped)
    @rule(i=pick, undo=st.booleans())
    def resume(self, i, undo):
        req = self._choose(self.swapped, i)
        owed = req.num_tokens - req.num_computed_tokens
        new = self.kv.resume_swapped(req, max(owed, 1))
        if new is None:
            event("resume did not fit")
            return
        if undo:  # taken back within the step: swapped out again, nothing copied
            self.kv.undo_resume(req)
            self._apply_swaps()
            return
        self.running[req.request_id] = self.swapped.pop(req.request_id)
        if owed:
            self._run_step(req, owed)
        else:
            self._apply_swaps()

    @rule()
    def reset_prefix_cache(self):
        assert self.kv.reset_prefix_cache() == (self.kv.num_used_blocks == 0)

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def references_are_the_lists_holding_each_block(self):
        pool, coord = self.kv.block_pool, self.kv.coordinator
        owners = [0] * NUM_BLOCKS
        per_group = [set() for _ in GROUPS]
        for g, manager in enumerate(coord.managers):
            for blocks in manager.req_to_blocks.values():
                for b in blocks:
                    if not b.is_null:
                        owners[b.block_id] += 1
                        per_group[g].add(b.block_id)
        assert [b.ref_cnt for b in pool.blocks[1:]] == owners[1:]
        assert self.kv.group_used_blocks == tuple(len(s) for s in per_group)
        assert not set.intersection(*per_group)  # a block belongs to one group at a time
        free = {b.block_id for b in pool.free_block_queue.get_all_free_blocks()}
        assert free == {b.block_id for b in pool.blocks[1:] if b.ref_cnt == 0}
        assert set(coord.request_ids()) == set(self.running)

    @invariant()
    def cached_blocks_are_keyed_by_their_group(self):
        for g, manager in enumerate(self.kv.coordinator.managers):
            for rid, blocks in manager.req_to_blocks.items():
                req = self.running[rid]
                for i, b in enumerate(blocks):
                    if b.block_hash is not None:
                        assert b.block_hash == group_key(req.block_hashes[i], g)

    def _check_reads(self, req: Request) -> None:
        """The keys the request's next query reads hold its tokens, in every group: all of them
        in the full group, its window in a sliding one."""
        c = req.num_computed_tokens
        for group, blocks in zip(GROUPS, self.kv.get_block_ids(req.request_id)):
            window = group.spec.sliding_window
            first = 0 if window is None else max(0, c - window + 1)
            seen = [self.device.get(blocks[p // BS], [None] * BS)[p % BS]
                    for p in range(first, c)]
            assert seen == req.all_token_ids[first:c], f"{req.request_id} reads wrong KV"

    @invariant()
    def every_request_reads_its_own_tokens(self):
        for req in self.running.values():
            self._check_reads(req)

    @invariant()
    def a_window_holds_its_blocks_and_one_steps(self):
        for rid, req in self.running.items():
            for group, blocks in zip(GROUPS, self.kv.get_block_ids(rid)):
                held = sum(1 for b in blocks if b != 0)
                assert held <= group.spec.max_blocks(req.num_computed_tokens, BS, MAX_LEN)

    @invariant()
    def swap_space_holds_the_swapped(self):
        assert set(self.kv.swap_space.req_to_blocks) == set(self.swapped)


HybridMachine.TestCase.settings = settings(stateful_step_count=40, max_examples=60,
                                           deadline=None)
TestHybridKVCache = HybridMachine.TestCase
