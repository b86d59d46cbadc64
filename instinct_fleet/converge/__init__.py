"""How a host gets there: the declaration of what a deploy manages, the preflight facts, the host plan and the one applier.

It reads instinct_fleet.model and nothing above it (fleet, the command line).
"""
