"""BlockPool against a plain model, for each cache policy, with and without a host tier: random
takes, shares, frees, hits, keys and copy-on-writes; after each, no block is leaked or in two
states, reference counts are the holders, cached blocks leave in the policy's order (the least
recently freed first), and keys are held as the policy says."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvbench.memory.block_pool import LRU, VLLM, BlockPool
from kvbench.memory.host_cache import HostBlockCache

NUM_BLOCKS = 12
KEYS = [("k", i) for i in range(6)]


class PoolMachine(RuleBasedStateMachine):
    """The model: holders per held block, the free stack, the never-used count, the eviction
    queue, each key's holders in the order they took it, and the host tier's keys."""

    policy = LRU
    host_slots: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self.host = None if self.host_slots is None else HostBlockCache(self.host_slots, 1)
        self.pool = BlockPool(NUM_BLOCKS, 10, policy=self.policy, host=self.host)
        self.holders: dict[int, int] = {}
        self.free: list[int] = []
        self.fresh = NUM_BLOCKS
        self.queue: list[int] = []
        self.key_of: dict[int, tuple] = {}
        self.holders_of_key: dict[tuple, list[int]] = {}
        self.host_keys: list[tuple] = []

    # --- the model's own steps -------------------------------------------------------------------

    def _model_drop_key(self, block_id: int) -> None:
        key = self.key_of.pop(block_id, None)
        if key is not None:
            self.holders_of_key[key].remove(block_id)
            if not self.holders_of_key[key]:
                del self.holders_of_key[key]

    def _model_take(self, n: int) -> list[int]:
        taken = []
        for _ in range(n):
            if self.free:
                taken.append(self.free.pop())
            elif self.fresh:
                taken.append(NUM_BLOCKS - self.fresh)
                self.fresh -= 1
            else:  # the front of the queue, its key to the host tier when it was the last holder
                block_id = self.queue.pop(0)
                key = self.key_of[block_id]
                if self.host is not None and self.holders_of_key[key] == [block_id] and self.host_slots:
                    if key in self.host_keys:
                        self.host_keys.remove(key)
                    elif len(self.host_keys) >= self.host_slots:
                        self.host_keys.pop(0)
                    self.host_keys.append(key)
                self._model_drop_key(block_id)
                taken.append(block_id)
        for block_id in taken:
            self.holders[block_id] = 1
        return taken

    def _model_release(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            (self.queue if block_id in self.key_of else self.free).append(block_id)

    def _held(self) -> list[int]:
        return sorted(self.holders)

    # --- rules -----------------------------------------------------------------------------------

    @rule(n=st.integers(0, 5), keep_blocks=st.integers(0, 3))
    def take(self, n: int, keep_blocks: int) -> None:
        available = len(self.free) + self.fresh + len(self.queue)
        keep_free_bytes = keep_blocks * self.pool.block_bytes
        assert self.pool.can_take(n, keep_free_bytes) == (available - n >= keep_blocks)
        if n > available:
            return
        assert self.pool.take(n) == self._model_take(n), "blocks handed out in another order"

    @rule()
    def take_one(self) -> None:
        available = len(self.free) + self.fresh + len(self.queue)
        assert self.pool.take_one() == (self._model_take(1)[0] if available else None)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def share(self, data: st.DataObject) -> None:
        blocks = data.draw(st.lists(st.sampled_from(self._held()), max_size=4))
        self.pool.share(blocks)
        for block_id in blocks:
            self.holders[block_id] += 1

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), reverse=st.booleans())
    def free_table(self, data: st.DataObject, reverse: bool) -> None:
        table = data.draw(st.lists(st.sampled_from(self._held()), min_size=1, max_size=4, unique=True))
        released = self.pool.drop_holders(table)
        expected = []
        for block_id in table:
            self.holders[block_id] -= 1
            if not self.holders[block_id]:
                del self.holders[block_id]
                expected.append(block_id)
        assert released == expected
        order = released[::-1] if reverse else released
        self.pool.release(order)
        self._model_release(order)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def unref(self, data: st.DataObject) -> None:
        block_id = data.draw(st.sampled_from(self._held()))
        self.holders[block_id] -= 1
        gone = not self.holders[block_id]
        if gone:
            del self.holders[block_id]
            self._model_release([block_id])
        assert self.pool.unref(block_id) == gone

    @rule(data=st.data())
    def hit(self, data: st.DataObject) -> None:
        """A prefix hit: the blocks a lookup finds gain a holder, an evictable one is revived."""
        keys = data.draw(st.lists(st.sampled_from(KEYS), max_size=3, unique=True))
        blocks = [self.pool.block_of[k] for k in keys if k in self.pool.block_of]
        revived = 0
        for block_id in blocks:
            if block_id in self.queue:
                self.queue.remove(block_id)
                self.holders[block_id] = 1
                revived += 1
            else:
                self.holders[block_id] += 1
        assert self.pool.count_evictable(blocks) == revived
        assert self.pool.reference(blocks) == revived

    @precondition(lambda self: any(b not in self.key_of for b in self.holders))
    @rule(data=st.data(), key=st.sampled_from(KEYS))
    def add_key(self, data: st.DataObject, key: tuple) -> None:
        block_id = data.draw(st.sampled_from([b for b in self._held() if b not in self.key_of]))
        takes = key not in self.holders_of_key or self.policy.keep_duplicates
        if key not in self.holders_of_key and key in self.host_keys:
            self.host_keys.remove(key)  # computed again: the host copy goes
        if takes:
            self.key_of[block_id] = key
            self.holders_of_key.setdefault(key, []).append(block_id)
        assert self.pool.add_key(block_id, key) == takes

    @precondition(lambda self: any(b in self.key_of for b in self.holders))
    @rule(data=st.data())
    def drop_key(self, data: st.DataObject) -> None:
        block_id = data.draw(st.sampled_from([b for b in self._held() if b in self.key_of]))
        self.pool.drop_key(block_id)
        self._model_drop_key(block_id)

    @precondition(lambda self: any(n > 1 for n in self.holders.values()))
    @rule(data=st.data())
    def copy_on_write(self, data: st.DataObject) -> None:
        """A write into a shared block: a new block for the writer, the shared one keeps the others."""
        shared_id = data.draw(st.sampled_from([b for b in self._held() if self.holders[b] > 1]))
        if not len(self.free) + self.fresh + len(self.queue):
            return
        holders_before = self.pool.refcount(shared_id)
        (copy_id,) = self.pool.take(1)
        assert [copy_id] == self._model_take(1)
        assert self.pool.drop_holders([shared_id]) == []
        self.holders[shared_id] -= 1
        assert self.pool.refcount(shared_id) == holders_before - 1 and self.pool.refcount(copy_id) == 1

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def every_block_in_one_state(self) -> None:
        pool = self.pool
        never_used = list(range(NUM_BLOCKS - pool.num_fresh, NUM_BLOCKS))
        states = pool.free_block_ids + never_used + list(pool.evictable) + list(self.holders)
        assert sorted(states) == list(range(NUM_BLOCKS)), "a block was leaked or is in two states"
        assert pool.free_block_ids == self.free and pool.num_fresh == self.fresh
        assert pool.num_held() == len(self.holders)
        assert pool.num_available() == len(self.free) + self.fresh + len(self.queue)

    @invariant()
    def refcounts_are_holders(self) -> None:
        for block_id in range(NUM_BLOCKS):
            assert self.pool.refcount(block_id) == self.holders.get(block_id, 0)
        assert self.pool.num_extra_refs == sum(n - 1 for n in self.holders.values())
        assert self.pool.num_shared_blocks() == sum(n > 1 for n in self.holders.values())

    @invariant()
    def cached_blocks_in_policy_order(self) -> None:
        assert self.pool.cached_block_ids() == self.queue, "the eviction queue is not least recently freed first"
        assert all(b in self.pool.key_of for b in self.queue), "an evictable block has no key"

    @invariant()
    def keys_held_as_the_policy_says(self) -> None:
        assert self.pool.key_of == self.key_of
        assert self.pool.block_of == {k: blocks[0] for k, blocks in self.holders_of_key.items()}
        if not self.policy.keep_duplicates:
            assert all(len(blocks) == 1 for blocks in self.holders_of_key.values())
        if self.host is not None:
            assert self.host.keys() == self.host_keys
            assert not set(self.host.keys()) & set(self.pool.block_of), "a key is in both tiers"


def _machine(policy, host_slots):
    return type(f"Pool_{policy.name}_{host_slots}", (PoolMachine,), {"policy": policy, "host_slots": host_slots})


@pytest.mark.parametrize("host_slots", [None, 0, 2])
@pytest.mark.parametrize("policy", [LRU, VLLM], ids=lambda p: p.name)
def test_block_pool_against_its_model(policy, host_slots):
    machine = _machine(policy, host_slots)
    machine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
    machine.TestCase().runTest()


def test_take_hands_out_given_back_then_never_used_then_least_recently_freed_cached():
    pool = BlockPool(6, 1)
    assert pool.take(3) == [0, 1, 2]
    pool.add_key(0, "a")
    pool.add_key(1, "b")
    pool.release([1, 0, 2])  # keyed ones queue in this order; 2 goes on the free stack
    assert pool.cached_block_ids() == [1, 0] and pool.free_block_ids == [2]
    assert pool.take(5) == [2, 3, 4, 5, 1]  # given back, never used, then the front of the queue
    assert pool.key_of == {0: "a"} and pool.num_evicted_blocks == 1


def test_duplicates_keep_the_earliest_holder_serving_lookups():
    pool = BlockPool(4, 1, policy=VLLM)
    first, second = pool.take(2)
    assert pool.add_key(first, "a") and pool.add_key(second, "a")
    pool.release([first, second])
    assert pool.take(3) == [2, 3, first]  # the first holder evicted: the second serves "a" now
    assert pool.block_of == {"a": second}
    assert BlockPool(4, 1).add_key(0, "a") and not _keyed_twice(BlockPool(4, 1))


def _keyed_twice(pool: BlockPool) -> bool:
    a, b = pool.take(2)
    return pool.add_key(a, "x") and pool.add_key(b, "x")
