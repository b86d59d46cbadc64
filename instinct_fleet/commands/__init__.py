"""The standalone commands that act on a live fleet outside a deploy: status, tune (its sweeps, trials and report),
Prometheus targets, SLO and alert rules, Grafana boards and their picture.

It reads every folder below it; only the command line reads it.
"""
