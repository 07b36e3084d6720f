"""Disaggregated serving: prefill and decode workers, each its own engine, a router between them,
and the KV cache moved from one to the other (``deployment=disagg``).

- :mod:`kvbench.deploy.interfaces`: what a router sees of a worker, and what a KV link promises;
- the workers, the routers, the links and the loop that runs them live in modules beside it.
"""
