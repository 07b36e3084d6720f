"""A collective curve for tests of the profiled clock: it records the message sizes it is asked
for and costs nothing, so a test reads what a step looked up."""


class RecordingCollective:
    def __init__(self) -> None:
        self.sizes: list[float] = []

    def latency_s(self, size: float) -> float:
        self.sizes.append(size)
        return 0.0
