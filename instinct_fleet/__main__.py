"""``python -m instinct_fleet`` and the ``instinct-fleet`` script.

gevent's monkey patch comes first, before anything imports sockets or threads, as
pyinfra's own command line does: status, bench and tune then talk to every host
at once (pyinfra's connectors run in greenlets), instead of one after another.
"""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402

from instinct_fleet.cli import main  # noqa: E402


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
