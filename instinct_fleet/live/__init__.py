"""What asks live engines, for the roll's canary and the commands alike: one command per host, the benchmark, the
accuracy probe, the verdict against noise, the canary's verdict, benchmark reports and Ctrl-C in greenlets.

It reads instinct_fleet.model and instinct_fleet.converge.
"""
