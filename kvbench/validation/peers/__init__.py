"""Other engines' own schedulers, driven step by step over the same requests as kvbench.

Each peer module exposes ``run(requests, caps) -> PeerTrace``: it feeds the requests to the
engine's real scheduler (no GPU, no weights: a fake model that returns one token for every
request whose scheduled tokens complete its known tokens), on a clock where every step lasts
``caps.step_s``, and records what each step scheduled. :mod:`kvbench.validation.differential`
runs kvbench on the same clock and compares the two records step by step.
"""
