"""Checks of kvbench's predictions against measurements and against other estimators.

aic  aiconfigurator-core's own agg-mode TTFT/TPOT estimate for silicon_sample.csv rows
"""
