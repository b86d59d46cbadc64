"""The router's pools as data: which instances stand behind which router, and where a serving host drains.

Computed once from the whole inventory by :func:`instinct_fleet.model.router.attach`; the
router host renders its units from ``HostSpec.pools``, a serving host drains through
``HostSpec.memberships``.
"""

from __future__ import annotations

from dataclasses import dataclass

from instinct_fleet.model import paths


@dataclass(frozen=True)
class Worker:
    """One serving instance in a pool: where its host is, its unit, and the URL the router reaches it at."""

    host: str
    unit: str
    url: str
    watch: str | None = None  # its host's watch /state (the host's watch is on), which says whether it holds the worker out


@dataclass(frozen=True)
class Pool:
    """One router unit on a router host: a model's instances behind ``port``, where its front passes on the clients'
    OpenAI routes alone; the router itself (its worker API included) listens on ``admin_port``."""

    model: str
    port: int
    metrics_port: int
    workers: tuple[Worker, ...]
    admin_port: int
    # Listed workers whose unit was not running at this run's preflight: the sync never adds one (and takes one out
    # that the router holds), its own host's roll adds it after its health gate. Nothing of ours holds its port until
    # then, so whatever answers there (an unprivileged user's listener on a host whose deploy failed) is not ours.
    joining: frozenset[str] = frozenset()

    @property
    def unit(self) -> str:
        return paths.router_unit(self.port)

    @property
    def worker_list(self) -> str:
        """The worker file's content: one URL per line, sorted."""
        return "".join(f"{url}\n" for url in sorted(w.url for w in self.workers))

    @property
    def watch_list(self) -> str:
        """The watch file's content: one ``URL WATCH_STATE_URL`` line per worker whose host runs the watch, sorted."""
        return "".join(f"{w.url} {w.watch}\n" for w in sorted(self.workers, key=lambda w: w.url) if w.watch)


@dataclass(frozen=True)
class Membership:
    """A serving unit's place in one router's pool: the roll takes it out there before the unit stops."""

    router: str  # the router host
    api: str  # http://address:admin_port of that router: its worker API, which clients never reach
    unit: str
    url: str
