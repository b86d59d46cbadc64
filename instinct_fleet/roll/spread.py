"""Warm restarts across the fleet: a compile cache built by the first host to restart is carried to the hosts after it.

A vLLM start on MI300X spends minutes compiling (torch.compile, Triton, AITER's JIT
modules) unless its cache holds the configuration already; each host keeps that cache
per image (``compile_cache_dir``, :func:`instinct_fleet.model.paths.compile_cache`). In a
roll, the first host that restarts an instance builds its entries; once its batch passed
the health gate, it packs its cache (templates/cache-spread.sh), the control machine
fetches the copy and checks its sha256, and every host that restarts the same
configuration on the same GPU architecture in a later batch receives it before its own
batch. The receiver checks the copy again (sum, image id) and moves its entries in one
rename each, so a partial copy is never used; a refused or failed copy only means that
host compiles, as it would have: the roll goes on.

What "the same configuration" is comes from the pinned vLLM's own key
(:func:`instinct_fleet.model.render.compile_config`); the control machine relays the
copies, so no host needs SSH access to another. In a Ray cluster each node builds the
kernels of its own ranks (its Ray container mounts the same cache directory): the head
of the first cluster to roll sends to the heads of later clusters of the same
configuration, its worker to their workers. vLLM gives the driver's node the first
ranks and orders the other nodes by address, so with two nodes each copy holds the
receiver's own ranks; with more, a worker may receive another worker's ranks, which
vLLM's key leaves unused (that node compiles them), never misused.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from instinct_fleet.converge.progress import LOST
from instinct_fleet.model import paths, render

if TYPE_CHECKING:
    from instinct_fleet.converge.hostplan import HostPlan


@dataclass(frozen=True)
class Spread:
    """One cache copy: ``source`` packs ``cache`` (the same path on every host) after its batch, and ``receivers``
    merge it before theirs (or, in ``instinct-fleet warm``, without restarting)."""

    source: str
    cache: str
    image: str
    batch: int
    receivers: tuple[str, ...]


@dataclass(frozen=True)
class Bundle:
    """A packed cache on the control machine, checked against the sum its source computed."""

    path: Path
    sha256: str
    size: int
    image_id: str


Member = tuple[int, str, str, str]  # (batch, host, the unit whose start builds it, image)
# (compile configuration, GPU architecture, cache, node role: "" single-node, else "head" or "worker") -> its members
Groups = dict[tuple[str, str, str, str], list[Member]]


class Turn(Protocol):
    """What spreading reads of a host's part in the roll (:class:`instinct_fleet.roll.roll.Turn`)."""

    @property
    def batch(self) -> int | None: ...

    @property
    def pending(self) -> tuple[str, ...]: ...

    @property
    def defers_docker(self) -> bool: ...


def groups(plans: Mapping[str, HostPlan], turns: Mapping[str, Turn]) -> Groups:
    """The instances that (re)start in this run, by what builds the same cache: (compile configuration, GPU
    architecture, cache directory, node role). A host without one architecture (rocm-smi, mixed GPUs) is in none.
    A cluster node's member is the unit whose start builds its ranks: the instance on the head, Ray on a worker."""
    found: Groups = {}
    for name, plan in sorted(plans.items()):
        turn = turns.get(name)
        arch = plan.report.gpu_arch
        if turn is None or turn.batch is None or arch is None:
            continue
        role = plan.spec.cluster.role if plan.spec.cluster is not None else ""
        for svc in plan.spec.services:
            unit = paths.ray_unit(role) if role == "worker" else paths.vllm_unit(svc.name)
            if unit not in turn.pending:  # a no-op run restarts nothing: no configuration to digest
                continue
            config = render.compile_config(svc, plan.spec.vars.vllm_api_key_path)
            if config is not None:
                found.setdefault((config, arch, plan.spec.compile_cache(svc), role), []).append((turn.batch, name, unit, svc.image))
    return found


def plan(
    found: Groups,
    warm: Mapping[str, frozenset[str]] | None = None,
    batch_of: Callable[[str], int | None] | None = None,
) -> tuple[Spread, ...]:
    """Who sends which cache to whom, from :func:`groups`: per group, its first member by batch (then name) sends to
    the members of later batches. ``warm`` (:func:`warm_sources`, with the warm run's ``batch_of``): the member it
    restarts sends to every other member, which does not restart in the run."""
    sends: dict[tuple[str, str], tuple[int, str, set[str]]] = {}
    for (_config, _arch, cache, _role), members in sorted(found.items()):
        if warm is None or batch_of is None:
            batch, source, _unit, image = min(members)
        else:
            built = [m for m in sorted(members) if m[2] in warm.get(m[1], ())]
            if not built:  # no member builds it in a warm run (its dockerd restarts, or a cluster's): the next deploy does
                continue
            _, source, _unit, image = built[0]
            batch = batch_of(source) or 0
        later = {h for b, h, _, _ in members if h != source and (warm is not None or b > batch)}
        if later:
            sends.setdefault((source, cache), (batch, image, set()))[2].update(later)
    return tuple(Spread(source, cache, image, batch, tuple(sorted(to))) for (source, cache), (batch, image, to) in sorted(sends.items()))


def warm_sources(members: Groups, turns: Mapping[str, Turn]) -> dict[str, frozenset[str]]:
    """``instinct-fleet warm``: per host, the instance units it restarts so that every configuration is built once,
    on as few hosts as it can (greedy set cover: the host that builds the most configurations not built yet, then
    by name); a host restarts only the instances of the configurations it builds. A host whose docker settings
    change builds nothing: restarting dockerd would stop every container on it, the ones warm leaves too."""
    # A cluster builds only by rolling as a whole, every member at once: warm leaves clusters to the deploy.
    hosts_of = {key: {h for _, h, _, _ in found if not turns[h].defers_docker} for key, found in members.items() if not key[3]}
    left = {key for key, hosts in hosts_of.items() if hosts}
    chosen: dict[str, set[str]] = {}
    while left:
        best = min({h for key in left for h in hosts_of[key]}, key=lambda h: (-sum(h in hosts_of[key] for key in left), h))
        built = {key for key in left if best in hosts_of[key]}
        chosen[best] = {u for key in built for _, h, u, _ in members[key] if h == best}
        left -= built
    return {host_name: frozenset(units) for host_name, units in chosen.items()}


@dataclass
class Carried:
    """The run's copies: what each source packed, and what each host's cache did (the roll summary's ``cache``)."""

    bundles: dict[tuple[str, str], Bundle] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    _spool: Path | None = None

    def spool(self) -> Path:
        """A directory on the control machine for the run's copies, removed when the run ends."""
        if self._spool is None:
            self._spool = Path(tempfile.mkdtemp(prefix="instinct-fleet-caches-"))
            atexit.register(shutil.rmtree, self._spool, True)
        return self._spool

    def note(self, host_name: str, text: str) -> None:
        self.notes.setdefault(host_name, []).append(text)


def _connector_arguments() -> dict[str, Any]:
    """The operation's connector arguments (``_sudo`` and the like), for the transfers a FunctionCommand makes."""
    given: dict[str, Any] = dict(host.current_op_global_arguments or {})
    return {key: given[key] for key in CONNECTOR_ARGUMENT_KEYS if key in given}


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pack(state: Any, host: Any, spread: Spread, carried: Carried, connector: dict[str, Any]) -> bool:
    """On the source: pack, fetch to the control machine, check the sum. A cache that cannot be carried is noted,
    never a failure: the later hosts compile, as they would have."""
    digest = hashlib.sha256(f"{spread.source}:{spread.cache}".encode()).hexdigest()[:12]
    remote = paths.spread_bundle(spread.cache, digest)
    ok, output = host.run_shell_command(StringCommand("sh", paths.CACHE_SPREAD, "pack", spread.cache, remote), **connector)
    said = dict(line.split(" ", 1) for line in output.stdout_lines if " " in line)
    if not ok or not {"id", "sha256", "bytes"} <= said.keys():
        why = " ".join(output.stderr_lines[-1:]) or "no answer"
        carried.note(host.name, f"compile cache not sent: {why}")
        return True
    local = carried.spool() / f"{host.name}-{Path(remote).name}"
    try:
        fetched = host.get_file(remote, str(local), **connector)
    except LOST as exc:
        fetched, said["error"] = False, str(exc) or type(exc).__name__
    finally:
        host.run_shell_command(StringCommand("rm", "-f", remote), **connector)
    if not fetched or _sha256(local) != said["sha256"]:
        local.unlink(missing_ok=True)
        why = said.get("error") or "the copy on the control machine does not match the source's sha256"
        carried.note(host.name, f"compile cache not sent: fetching it failed ({why})")
        return True
    carried.bundles[(spread.source, spread.cache)] = Bundle(local, said["sha256"], int(said["bytes"]), said["id"])
    carried.note(host.name, f"compile cache sent to {len(spread.receivers)} host(s) ({_size(int(said['bytes']))})")
    return True


def _receive(state: Any, host: Any, spread: Spread, keep: int, carried: Carried, connector: dict[str, Any]) -> bool:
    """On a later host: upload the checked copy, and let cache-spread.sh check it again and merge it."""
    bundle = carried.bundles.get((spread.source, spread.cache))
    if bundle is None:
        carried.note(host.name, f"no compile cache from {spread.source}: it sent none (its row says why)")
        return True
    remote = paths.spread_bundle(spread.cache, bundle.sha256[:12])
    host.run_shell_command(StringCommand("mkdir", "-p", remote.rpartition("/")[0]), **connector)
    try:
        sent, why = host.put_file(str(bundle.path), remote, **connector), "the upload failed"
    except LOST as exc:
        sent, why = False, str(exc) or type(exc).__name__
    if not sent:
        host.run_shell_command(StringCommand("rm", "-f", remote), **connector)
        carried.note(host.name, f"compile cache from {spread.source} not received: {why}; the partial copy was removed")
        return True
    argv = ("sh", paths.CACHE_SPREAD, "receive", spread.cache, spread.image, str(keep), remote, bundle.sha256)
    ok, output = host.run_shell_command(StringCommand(*argv), **connector)
    if ok:
        moved = next((line.split()[1] for line in output.stdout_lines if line.startswith("moved ")), "0")
        carried.note(host.name, f"compile cache from {spread.source} received ({_size(bundle.size)}, {moved} new entries)")
    else:
        why = next((line for line in reversed(output.stderr_lines) if line.strip()), "no answer")
        carried.note(host.name, f"compile cache from {spread.source} {why}")
    return True


@operation(is_idempotent=False)
def cache_sent(spread: Spread, carried: Carried) -> Generator[Any, None, None]:
    """Pack the source's cache once its batch passed, and keep a checked copy on the control machine."""
    if host.state.is_executing:
        yield FunctionCommand(_pack, (spread, carried, _connector_arguments()), {})


@operation(is_idempotent=False)
def cache_received(spread: Spread, keep: int, carried: Carried) -> Generator[Any, None, None]:
    """Merge the source's checked copy into this host's cache before its own batch restarts anything."""
    if host.state.is_executing:
        yield FunctionCommand(_receive, (spread, keep, carried, _connector_arguments()), {})


def emit_sends(spreads: tuple[Spread, ...], me: str, batch: int, carried: Carried, gate: Callable[[], bool], timeout: int) -> None:
    """The source's operations for ``batch``: each cache it sends, behind ``gate`` (its batch passed)."""
    for spread in spreads:
        if spread.source == me and spread.batch == batch:
            cache_sent(name=f"Compile cache: send {spread.cache}", spread=spread, carried=carried, _if=gate, _timeout=timeout)


def emit_receives(
    spreads: tuple[Spread, ...], me: str, batch: int, keep: int, carried: Carried, gate: Callable[[], bool], timeout: int
) -> None:
    """A receiver's operations after ``batch``: each cache a source of that batch sent, behind ``gate``."""
    for spread in spreads:
        if me in spread.receivers and spread.batch == batch:
            cache_received(
                name=f"Compile cache: receive {spread.cache} from {spread.source}",
                spread=spread,
                keep=keep,
                carried=carried,
                _if=gate,
                _timeout=timeout,
            )
