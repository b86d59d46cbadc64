"""``python -m instinct_fleet`` and the ``instinct-fleet`` script.

gevent's monkey patch comes first, before anything imports sockets or threads, as
pyinfra's own command line does: status, bench and tune then talk to every host
at once (pyinfra's connectors run in greenlets), instead of one after another.
Before even that, Ctrl-C and SIGTERM stop the command with one line: loading its
modules takes a second or two, and Python's own handler would show a traceback.
The command installs its own handlers once it runs (cli.main).
"""

import signal
import sys

from instinct_fleet.live import interrupts  # the signal module only: nothing that opens sockets or threads


def _stopped_while_loading(signum: int, _frame: object) -> None:
    print(interrupts.stopped(signal.Signals(signum).name), file=sys.stderr)
    raise SystemExit(interrupts.EXIT)  # nothing ran


for _number in interrupts.SIGNALS:
    signal.signal(_number, _stopped_while_loading)

from gevent import monkey  # noqa: E402

monkey.patch_all()

from instinct_fleet.cli import main  # noqa: E402


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
