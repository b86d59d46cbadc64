"""instinct-fleet: turn AMD Instinct MI300X-class hosts into a tuned vLLM serving fleet.

Data flows one way: group_data -> :mod:`instinct_fleet.model.spec` (typed) ->
:mod:`instinct_fleet.model.validate` -> :mod:`instinct_fleet.model.render` -> templates -> host.
"""

__version__ = "0.1.0"
