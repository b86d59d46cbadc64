"""What runs on a live fleet: the pyinfra run, the roll and its canary, generations restored, bench, tune, status, reports.

It reads instinct_fleet.model and instinct_fleet.converge; only the command line reads it.
"""
