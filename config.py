"""pyinfra's config for this project: pyinfra loads config.py from the deploy directory before the inventory.

A host that accepts TCP but never sends the SSH banner (hung, or paused) makes
paramiko log two Python tracebacks; pyinfra already reports that host in one
line, so paramiko's own log is kept to critical messages.
"""

import logging

logging.getLogger("paramiko").setLevel(logging.CRITICAL)
