"""The admission queue: the order in which waiting requests are offered to the scheduler.

The scheduler admits from the head of its queue and stops at the first head that does not fit (no
request is skipped over: a refused head waits for memory). What the head is, is the queue's
choice. ``scheduler.queue`` picks one by name; plugins add more through the
``kvbench_register_queues`` hook.

- ``fcfs``: arrival order; a preempted request goes back to the front (vLLM's FCFS queue).
- ``priority``: lowest ``Request.priority`` first, then earliest arrival, then lowest id (vLLM's
  ``PriorityRequestQueue``); a preempted request goes back in at its key.
- ``shortest_prompt``: fewest tokens left to compute first (a request's prompt, plus what it had
  generated if a preemption cost it its cache), then arrival, then id.

A queue whose later arrivals may come out before its current head sets ``fifo = False``: the
engine then stops a run of quiet decode steps at every arrival (the arrival might be admitted),
where a first-come-first-served queue with a refused head lets it run on (an arrival waits behind
that head anyway).
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from typing import ClassVar

from kvbench.core.sequence import SequenceGroup


class RequestQueue(ABC):
    """A queue plugin: ``name`` is what ``scheduler.queue`` selects it by."""

    name: ClassVar[str]
    #: requests come out in the order they went in (arrivals never overtake the head)
    fifo: ClassVar[bool] = False

    @abstractmethod
    def add(self, group: SequenceGroup) -> None:
        """A request arrives."""

    def add_deferred(self, num_requests: int, make: Callable[[], SequenceGroup]) -> None:
        """``num_requests`` requests arrive, after every request already in the queue; each call
        of ``make`` makes the next one's group, in arrival order. By default all are made now."""
        for _ in range(num_requests):
            self.add(make())

    @abstractmethod
    def add_preempted(self, group: SequenceGroup) -> None:
        """A request comes back after a recompute preemption (it holds no memory now)."""

    @abstractmethod
    def peek(self) -> SequenceGroup:
        """The head: the next request offered for admission (IndexError when empty)."""

    @abstractmethod
    def pop(self) -> SequenceGroup:
        """Remove and return the head (the scheduler admitted it)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[SequenceGroup]:
        """Every waiting request, in no particular order unless the queue says so."""

    def __bool__(self) -> bool:
        return len(self) > 0


class FcfsQueue(RequestQueue):
    """First come first served; preempted requests go back to the front (the newest in front)."""

    name = "fcfs"
    fifo = True

    def __init__(self) -> None:
        self._groups: deque[SequenceGroup] = deque()
        # deferred arrivals, behind every group in _groups: how many, and what makes the next one
        # (the engine passes one maker for all of them; another maker's arrivals come after the
        # first one's, whose groups are then made at once)
        self._num_deferred = 0
        self._make: Callable[[], SequenceGroup] | None = None

    def add(self, group: SequenceGroup) -> None:
        if self._num_deferred:
            self._make_deferred(self._num_deferred)  # it arrived after them: it goes behind them
        self._groups.append(group)

    def add_deferred(self, num_requests: int, make: Callable[[], SequenceGroup]) -> None:
        if self._num_deferred and make is not self._make:
            self._make_deferred(self._num_deferred)
        self._num_deferred += num_requests
        self._make = make

    def add_preempted(self, group: SequenceGroup) -> None:
        self._groups.appendleft(group)

    def peek(self) -> SequenceGroup:
        groups = self._groups
        if not groups and self._num_deferred:
            self._num_deferred -= 1
            groups.append(self._make())
        return groups[0]

    def pop(self) -> SequenceGroup:
        self.peek()
        return self._groups.popleft()

    def __len__(self) -> int:
        return len(self._groups) + self._num_deferred

    def __bool__(self) -> bool:  # (asked several times a turn: without going through __len__)
        return bool(self._groups) or self._num_deferred > 0

    def __iter__(self) -> Iterator[SequenceGroup]:
        self._make_deferred(self._num_deferred)  # (nothing in kvbench's loop iterates a queue)
        return iter(self._groups)

    def _make_deferred(self, num_requests: int) -> None:
        make = self._make
        for _ in range(num_requests):
            self._groups.append(make())
        self._num_deferred -= num_requests


class KeyedQueue(RequestQueue):
    """A heap ordered by :meth:`key`, computed when a request goes in; ties go to the request
    that went in first."""

    def __init__(self) -> None:
        self._heap: list[tuple[tuple, int, SequenceGroup]] = []
        self._order = itertools.count()

    def key(self, group: SequenceGroup) -> tuple:
        raise NotImplementedError

    def add(self, group: SequenceGroup) -> None:
        heapq.heappush(self._heap, (self.key(group), next(self._order), group))

    add_preempted = add

    def peek(self) -> SequenceGroup:
        return self._heap[0][2]

    def pop(self) -> SequenceGroup:
        return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[SequenceGroup]:
        return (entry[2] for entry in self._heap)


class PriorityQueue(KeyedQueue):
    """Lowest ``priority`` first, then earliest arrival, then lowest id (vLLM's priority policy)."""

    name = "priority"

    def key(self, group: SequenceGroup) -> tuple:
        request = group.request
        return (request.priority, request.arrival_s, request.request_id)


class ShortestPromptQueue(KeyedQueue):
    """Fewest tokens to compute first: the known tokens of its longest live branch (its prompt,
    or prompt and output after a recompute preemption), then arrival, then id."""

    name = "shortest_prompt"

    def key(self, group: SequenceGroup) -> tuple:
        tokens = max(seq.num_tokens for seq in group.live_seqs())
        return (tokens, group.request.arrival_s, group.request_id)


#: the queues kvbench ships (registered by plugins/schedulers/queues.py)
BUILT_IN_QUEUES = (FcfsQueue, PriorityQueue, ShortestPromptQueue)
