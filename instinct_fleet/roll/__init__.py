"""The roll that a deploy runs: the run's plan (plan.py), its wiring into pyinfra (run.py), the batches and their
journal (roll.py), a host's turn (serving.py), the canary inside the roll (measure.py) and warm restarts (spread.py).

It reads instinct_fleet.model, instinct_fleet.converge and instinct_fleet.live; the deploy functions read it.
"""
