"""The admission queues: their order, where a preempted request goes back, and the plugin seam."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from toy import request

from kvbench import hookimpl
from kvbench.api import build
from kvbench.core.sequence import SequenceGroup
from kvbench.errors import ConfigError
from kvbench.plugins import make_plugin_manager, registry
from kvbench.sched.queue import FcfsQueue, KeyedQueue, PriorityQueue, ShortestPromptQueue


def groups(*requests):
    return [SequenceGroup(r, r.request_id) for r in requests]


def drain(queue) -> list[int]:
    out = []
    while queue:
        out.append(queue.pop().request_id)
    return out


def test_fcfs_keeps_arrival_order_and_puts_a_preempted_request_in_front():
    a, b, c = groups(request(0, 4, 1), request(1, 4, 1), request(2, 4, 1))
    queue = FcfsQueue()
    for g in (a, b):
        queue.add(g)
    queue.add_preempted(c)
    assert queue.peek() is c and len(queue) == 3 and FcfsQueue.fifo
    assert drain(queue) == [2, 0, 1]


def test_priority_is_lowest_value_then_arrival_then_id_and_a_preempted_request_keeps_its_key():
    rows = [
        request(0, 4, 1, priority=1),
        request(1, 4, 1, priority=0, arrival_s=2.0),
        request(2, 4, 1, priority=0, arrival_s=1.0),
        request(3, 4, 1, priority=1),
    ]
    queue = PriorityQueue()
    for g in groups(*rows):
        queue.add(g)
    assert not PriorityQueue.fifo
    first = queue.pop()
    queue.add_preempted(first)  # back at its key, not in front
    assert drain(queue) == [2, 1, 0, 3]


def test_shortest_prompt_counts_the_tokens_left_to_compute():
    a, b, c = groups(request(0, 30, 1), request(1, 5, 1), request(2, 12, 1))
    c.seqs[0].num_tokens = 40  # preempted after generating 28 tokens: 40 to compute again
    queue = ShortestPromptQueue()
    for g in (a, b, c):
        queue.add(g)
    assert drain(queue) == [1, 0, 2]


class Maker:
    """Makes the groups of deferred arrivals in order, counting how many it has made."""

    def __init__(self, *requests):
        self.pending = groups(*requests)
        self.num_made = 0

    def __call__(self):
        self.num_made += 1
        return self.pending.pop(0)


def test_fcfs_makes_a_deferred_arrival_only_when_it_reaches_the_head():
    queue = FcfsQueue()
    queue.add(groups(request(0, 4, 1))[0])
    make = Maker(*(request(i, 4, 1) for i in range(1, 1001)))
    queue.add_deferred(1000, make)
    assert len(queue) == 1001 and make.num_made == 0
    assert queue.pop().request_id == 0 and make.num_made == 0
    assert queue.peek().request_id == 1 and make.num_made == 1
    queue.add_preempted(groups(request(5000, 4, 1))[0])  # in front, and nothing more is made
    assert queue.peek().request_id == 5000 and make.num_made == 1 and len(queue) == 1001
    assert drain(queue)[:3] == [5000, 1, 2] and make.num_made == 1000


def test_fcfs_puts_an_arrival_added_whole_behind_the_deferred_ones():
    queue = FcfsQueue()
    queue.add_deferred(2, Maker(request(0, 4, 1), request(1, 4, 1)))
    queue.add(groups(request(2, 4, 1))[0])
    queue.add_deferred(1, Maker(request(3, 4, 1)))  # another maker: the first one's groups come first
    assert len(queue) == 4
    assert sorted(g.request_id for g in queue) == [0, 1, 2, 3]
    assert drain(queue) == [0, 1, 2, 3]


def test_a_keyed_queue_makes_deferred_arrivals_at_once_and_orders_them_by_key():
    queue = PriorityQueue()
    make = Maker(request(0, 4, 1, priority=2), request(1, 4, 1, priority=1))
    queue.add_deferred(2, make)
    assert make.num_made == 2
    assert drain(queue) == [1, 0]


class ListQueue:
    """The FCFS queue's meaning written plainly: ids in a list, arrivals at the back, preempted at
    the front, and which deferred arrivals must have been made: the head once looked at, and every
    one an arrival added whole went behind."""

    def __init__(self):
        self.items = []
        self.deferred = set()  # ids whose groups should not be made yet
        self.num_made = 0  # deferred groups that must have been made

    def add(self, i, deferred=False):
        if not deferred:
            self.num_made += len(self.deferred)
            self.deferred.clear()
        else:
            self.deferred.add(i)
        self.items.append(i)

    def add_preempted(self, i):
        self.items.insert(0, i)

    def head(self):
        if self.items[0] in self.deferred:
            self.deferred.discard(self.items[0])
            self.num_made += 1
        return self.items[0]

    def pop(self):
        self.head()
        return self.items.pop(0)


@given(st.lists(st.tuples(st.sampled_from(["add", "deferred", "preempted", "pop"]), st.integers(1, 5)), max_size=60))
def test_fcfs_with_deferred_arrivals_behaves_as_if_every_group_were_made_on_arrival(operations):
    queue, plain = FcfsQueue(), ListQueue()
    next_id = 0
    make = Maker()  # one maker for every deferred batch, as the engine passes it
    for op, n in operations:
        if op == "add":
            queue.add(groups(request(next_id, 4, 1))[0])
            plain.add(next_id)
            next_id += 1
        elif op == "deferred":
            make.pending += groups(*(request(i, 4, 1) for i in range(next_id, next_id + n)))
            queue.add_deferred(n, make)
            for i in range(next_id, next_id + n):
                plain.add(i, deferred=True)
            next_id += n
        elif op == "preempted" and queue:
            popped = queue.pop().request_id  # back in front, as a recompute preemption puts it
            assert popped == plain.pop()
            queue.add_preempted(groups(request(popped, 4, 1))[0])
            plain.add_preempted(popped)
        elif op == "pop" and queue:
            assert queue.peek().request_id == plain.head()
            assert queue.pop().request_id == plain.pop()
        assert len(queue) == len(plain.items) and bool(queue) == bool(plain.items)
        assert make.num_made == plain.num_made  # made exactly when needed, never ahead
    assert drain(queue) == plain.items


class LongestFirst(KeyedQueue):
    name = "longest_first"

    def key(self, group):
        return (-group.request.prompt_tokens, group.request_id)


class QueuePlugin:
    @hookimpl
    def kvbench_register_queues(self):
        return [LongestFirst]


def test_kvbench_register_queues_adds_an_outside_queue_beside_the_built_ins():
    pm = make_plugin_manager((QueuePlugin(),))
    queues = registry("queue", pm)
    assert {"fcfs", "priority", "shortest_prompt", "longest_first"} <= set(queues)
    queue = queues["longest_first"]()
    for g in groups(request(0, 4, 1), request(1, 9, 1)):
        queue.add(g)
    assert drain(queue) == [1, 0]


def test_an_unknown_queue_is_one_line_naming_the_registered_ones():
    with pytest.raises(ConfigError, match=r"scheduler.queue='lifo' is not a registered queue; choose one of: fcfs"):
        build(["scheduler.queue=lifo"])
