"""pyinfra's config for this project: pyinfra loads config.py from the directory it is started in, before the inventory.

* Every chosen host is validated before pyinfra connects to the first one, so
  plain ``pyinfra inventories/prod.py deploy.py`` refuses an invalid inventory
  exactly as ``instinct-fleet deploy`` does (instinct_fleet/model/gate.py says
  what holds when pyinfra is started elsewhere).
* A host that accepts TCP but never sends the SSH banner (hung, or paused) makes
  paramiko log two Python tracebacks; pyinfra already reports that host in one
  line, so paramiko's own log is kept to critical messages.
"""

import logging

from instinct_fleet.model import gate

logging.getLogger("paramiko").setLevel(logging.CRITICAL)
gate.install()
