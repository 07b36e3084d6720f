"""The preemption interface: when a running sequence cannot grow, who gives up its cache, and how.

The engine owns the mechanics (freeing the victim's memory, putting it back at the front of the
waiting queue, charging the re-prefill or the transfer); a policy only decides. A preempted
sequence loses its cache, never its tokens: it resumes where it stopped.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence as SequenceType

from kvbench.core.sequence import Sequence


class PreemptionPolicy:
    """A preemption plugin: ``name`` matches ``conf/preemption/<name>.yaml``."""

    name: ClassVar[str]
    Config: ClassVar[type | None] = None
    #: mechanisms the engine offers; a policy returns one of them from :meth:`mechanism`
    RECOMPUTE: ClassVar[str] = "recompute"

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def select_victim(self, running: SequenceType[Sequence]) -> int:
        """Index into ``running`` (oldest admission first) of the sequence to evict.

        The default is the newest, as vLLM and nano-vllm do: it has the least progress to lose
        and the newest arrival has the weakest claim under first-come first-served.
        """
        return len(running) - 1

    def mechanism(self, victim: Sequence) -> str:
        """How ``victim`` gives up its cache: one of the mechanisms the engine offers."""
        raise NotImplementedError
