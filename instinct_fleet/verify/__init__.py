"""The testinfra verify module: what a deployed host must hold, read from the host independently of the deploy.

``instinct-fleet verify INVENTORY`` runs it (pytest with pytest-testinfra, the ``verify`` extra);
``pytest --pyargs instinct_fleet.verify --inventory INVENTORY`` is the same run by hand. It is
read-only, so it is safe against production.
"""
