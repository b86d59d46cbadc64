"""Plain ``pyinfra INVENTORY deploy.py`` refuses an invalid inventory before it connects to any host.

pyinfra loads ``config.py`` before the inventory and calls ``host_before_connect``
before it opens the first connection; ``config.py`` registers :class:`InventoryGate`,
which validates every chosen host then, as ``instinct-fleet deploy`` does, and
ends the run with the findings when there is an error.
"""

from __future__ import annotations

import os
from typing import Any

from pyinfra.api.state import BaseStateCallback

from instinct_fleet.model.inventory import hosts_of, plan_hosts, record_groups, with_cluster_peers
from instinct_fleet.model.rules import refused


class InventoryGate(BaseStateCallback):
    def __init__(self) -> None:
        self.checked = False

    def host_before_connect(self, state: Any, host: Any) -> None:  # type: ignore[override]  # pyinfra calls it on the instance
        if self.checked:
            return
        self.checked = True  # the first host's greenlet validates all of them before any connection yields
        data = hosts_of(state.inventory)
        planned = plan_hosts(data)
        chosen = with_cluster_peers(planned, {h.name for h in state.inventory if state.is_host_in_limit(h)})
        if refused(
            (f for spec, findings in planned if spec.host in chosen for f in findings), "nothing was deployed and no host was contacted"
        ):
            # Inside pyinfra's connect greenlet an exception would become a traceback; leave before any connection.
            os._exit(1)


def install(state: Any) -> None:
    """Register the gate on the run's State once pyinfra initialises it (``State.init`` resets the handlers)."""
    record_groups()
    init = state.init

    def init_then_gate(*args: Any, **kwargs: Any) -> None:
        init(*args, **kwargs)
        state.add_callback_handler(InventoryGate())

    state.init = init_then_gate
