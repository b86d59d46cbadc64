"""Plain ``pyinfra INVENTORY deploy.py`` refuses an invalid inventory, before it connects where it can, and always before it acts.

Two places run the same check (:func:`check`), once per run:

* Before the first connection, when the gate is installed (:func:`install`): by the project's
  ``config.py``, which pyinfra loads from the directory it is started in, and by an inventory
  that ``instinct-fleet init`` wrote, which installs it itself, so the gate holds from any working
  directory. pyinfra then calls ``host_before_connect`` before it opens the first connection.
* When the gate was not installed (a project's own ``config.py`` and inventory without it):
  before the first operation is queued, from the deploy functions
  (:func:`instinct_fleet.roll.run.fleet_plan`). Facts have been read then, but nothing was
  changed on any host: the run ends with a pyinfra error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pyinfra.api.state import BaseStateCallback

from instinct_fleet.model.catalog import Catalog, CatalogError
from instinct_fleet.model.inventory import hosts_of, plan_hosts, record_groups, with_cluster_peers
from instinct_fleet.model.origins import Sources
from instinct_fleet.model.rules import refused

_CHECKED = "instinct_fleet_gate_passed"  # on the run's State: None (not checked yet), True or False
_INSTALLED = "instinct_fleet_gate_installed"


def check(state: Any, consequence: str) -> bool:
    """Validate every chosen host of the run (and its cluster peers) once; print the findings; True when the run may go on."""
    passed = getattr(state, _CHECKED, None)
    if passed is not None:
        return bool(passed)
    try:
        project = catalog(state)
    except CatalogError as exc:
        print(f"instinct-fleet: {exc}: {consequence}", file=sys.stderr, flush=True)
        setattr(state, _CHECKED, False)
        return False
    planned = plan_hosts(hosts_of(state.inventory, Sources.of_run(state)), project)
    chosen = with_cluster_peers(planned, {h.name for h in state.inventory if state.is_host_in_limit(h)})
    ok = not refused((f for spec, findings in planned if spec.host in chosen for f in findings), consequence)
    setattr(state, _CHECKED, ok)
    return ok


def catalog(state: Any) -> Catalog:
    """The recipes and tables of the project a pyinfra run runs in (its directory): CatalogError for a bad file of its own."""
    return Catalog.of(Path(state.cwd or os.getcwd()))


class InventoryGate(BaseStateCallback):
    def host_before_connect(self, state: Any, host: Any) -> None:  # type: ignore[override]  # pyinfra calls it on the instance
        if not check(state, "nothing was deployed and no host was contacted"):  # checked once; every later host sees the answer
            sys.stdout.flush()
            sys.stderr.flush()
            # Inside pyinfra's connect greenlet an exception would become a traceback; leave before any connection.
            os._exit(1)


def install(state: Any | None = None) -> None:
    """Register the gate on the run's State once pyinfra initialises it (``State.init`` resets the handlers). Idempotent.

    ``state`` defaults to pyinfra's current one: the State the command line made before it
    loads ``config.py`` and the inventory.
    """
    if state is None:
        from pyinfra.context import ctx_state

        if not ctx_state.isset():  # type: ignore[no-untyped-call]
            return  # not inside a pyinfra run (the inventory read by instinct-fleet plan): nothing to guard
        state = ctx_state.get()  # type: ignore[no-untyped-call]
    record_groups()
    if getattr(state, _INSTALLED, False):
        return
    setattr(state, _INSTALLED, True)
    init = state.init

    def init_then_gate(*args: Any, **kwargs: Any) -> None:
        init(*args, **kwargs)
        state.add_callback_handler(InventoryGate())

    state.init = init_then_gate
