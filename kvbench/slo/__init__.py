"""Service-level objectives: the largest batch whose decode step meets a TPOT SLO
(``kvbench slo-batch``, cost-model arithmetic) and the largest arrival rate or batch cap whose
simulated runs meet every SLO (``kvbench slo-search``, bisection over runs). See docs/slo.md."""
