"""What a host should be: the typed variables, the inventory, recipes, vLLM's knowledge tables, validation and rendering.

Nothing here talks to a host or imports from the folders above it (converge, fleet, the command line).
"""
