"""pyinfra operations instinct-fleet adds: each yields a command only when one is needed."""

from __future__ import annotations

import os
import posixpath
import shlex
import subprocess
from collections.abc import Callable, Generator
from io import BytesIO
from typing import Any

from pyinfra import logger
from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from instinct_fleet.converge import generations, health, progress
from instinct_fleet.converge.facts import DockerImageId, InstanceHealth, UnitProblems
from instinct_fleet.model import paths
from instinct_fleet.model.paths import WEIGHTS_COMPLETE, WEIGHTS_STAGED
from instinct_fleet.model.pools import Membership


def failure(message: str) -> str:
    """A command that fails this host, and only this host, with ``message`` on stderr."""
    return f"printf '%s\\n' {shlex.quote('instinct-fleet: ' + message)} >&2; exit 1"


@operation(is_idempotent=False)
def fail(message: str | Callable[[], str]) -> Generator[str, None, None]:
    """Fail this host with a message that says what is wrong and how to fix it (a function: the message
    is made when the operation runs, from what the run found out by then)."""
    yield failure(message() if callable(message) else message)


@operation(is_idempotent=False)
def generation_saved(number: int, keep: int, healthy: bool) -> Generator[str, None, None]:
    """Keep the host's serving files as generation ``number`` (generations.save_script); only the roll runs it,
    when the files change, so a no-op run never does."""
    yield generations.save_script(number, keep, healthy)


@operation(is_idempotent=False)
def generation_restored(number: int, script: str) -> Generator[str, None, None]:
    """Put generation ``number``'s serving files back and restart the units whose files changed: ``script``,
    made from the declaration by :func:`instinct_fleet.converge.apply.restore`."""
    yield script


@operation()
def image_present(image: str) -> Generator[str, None, None]:
    """Pull ``image`` only when the host does not have it; a pinned tag never moves."""
    if host.get_fact(DockerImageId, image=image) is None:
        yield f"docker pull --quiet {shlex.quote(image)}"
    else:
        host.noop(f"image {image} is present")


INCOMING = ".instinct-fleet-incoming"  # in the SSH user's home (SFTP's relative paths start there), mode 0700


@operation()
def secret_written(path: str, content: bytes, owner: str, group: str) -> Generator[Any, None, None]:
    """A file only its owner may read (a token, registry credentials), written so that no other user of the host can
    read it at any moment, and its content is never in argv, a log or pyinfra's diff.

    As the SSH user (no sudo): a 0700 directory in its home, and the content uploaded into it by SFTP. Then, with
    the run's privileges: ``install`` copies it beside the destination with mode 0600 and its owner, ``mv``
    renames it into place (one step), and the upload is removed. pyinfra's own upload with sudo would stage it in
    /tmp, readable by anyone, and give the destination its mode only after the copy.
    """
    staged = f"{INCOMING}/{posixpath.basename(path)}"
    q = shlex.quote
    yield StringCommand(f"umask 077 && mkdir -p {INCOMING} && chmod 700 {INCOMING}", _sudo=False)
    yield FileUploadCommand(BytesIO(content), staged, _sudo=False)
    # Under sudo, HOME is root's: the upload is in the SSH user's home, which SUDO_USER names.
    home = 'home=$HOME; if [ -n "${SUDO_USER:-}" ]; then home=$(getent passwd "$SUDO_USER" | cut -d: -f6); fi'
    part = f"{path}.instinct-fleet-new"
    yield (
        f'{home} && install -D -m 600 -o {q(owner)} -g {q(group)} "$home"/{q(staged)} {q(part)} && mv -f {q(part)} {q(path)}'
        f' && rm -f "$home"/{q(staged)}'
    )


@operation()
def barrier(note: str) -> Generator[str, None, None]:
    """Changes nothing. pyinfra finishes an operation on every host before the next, so the operations
    before a barrier (a roll batch, the first image pull) are done everywhere before those after it start."""
    host.noop(note)
    yield from ()


def _control_hook(state: Any, host: Any, command: str, env: dict[str, str], record: Callable[[str, str], None]) -> bool:
    """Run a rolling hook on the control machine; a failure fails this host only, with the hook's own words.

    pyinfra passes ``state`` and ``host`` to a FunctionCommand only when the
    function names both parameters so, and reads its return value as the status.
    """
    done = subprocess.run(command, shell=True, env={**os.environ, **env}, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return True
    detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    message = f"rolling hook on the control machine exited {done.returncode}: {command!r}: {' | '.join(detail) or '(no output)'}"
    logger.error(f"{host.print_prefix}{message}")
    record(host.name, message)
    return False


@operation(is_idempotent=False)
def hook(command: str, where: str, env: dict[str, str], record: Callable[[str, str], None]) -> Generator[Any, None, None]:
    """A rolling_pre_stop / rolling_post_start command, run on the host or on the control machine.

    It only runs inside a batch that restarts this host's serving unit, so a
    no-op re-tune never runs it.
    """
    if where == "control":
        yield FunctionCommand(_control_hook, (command, env, record), {})
        return
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in sorted(env.items()))
    yield f"export {exports}; {command}"


@operation()
def healthy(
    unit: str,
    port: int,
    served_model: str,
    timeout: int,
    key_path: str | None = None,
    record: Callable[[str, str], None] | None = None,
    generates: bool = True,
    hold: Callable[[str, str], None] | None = None,
    started: Callable[[str, str, health.Startup], None] | None = None,
    log_formats: dict[str, tuple[str, ...]] | None = None,
) -> Generator[str, None, None]:
    """Wait until an instance is healthy (health.serving: /health, its model listed, one token generated);
    fail the host if it is not, or, with ``hold`` (a batch that rolls back), hand it the reason and keep the
    host in the run so that its rollback can run. Healthy, ``started`` gets this start's phases from the unit's
    journal, read with ``log_formats`` (the pinned vLLM's start-up lines, knowledge.startup_log).

    Changes nothing, so it never counts as a change. It only waits while the
    deploy executes: at plan time the units may not even exist yet.
    """
    if not host.state.is_executing:
        return
    formats = log_formats or {}
    anchors = health.log_anchors(formats)
    sudo = {k: v for k, v in (host.current_op_global_arguments or {}).items() if k.startswith(("_sudo", "_su_", "_doas"))}
    this = host.state.inventory.get_host(host.name)  # the Host itself: pyinfra's `host` is set only in this greenlet
    phase = health.phase_probe(lambda command: progress.stdout_of(this, command, 15, **sudo), unit, formats)  # its own channel
    with progress.of_run(host.state).waiting(f"{host.name} {unit}", f"health gate on :{port}", timeout, phase):
        result = host.get_fact(
            InstanceHealth,
            unit=unit,
            port=port,
            served=served_model,
            timeout=timeout,
            key_path=key_path,
            generates=generates,
            anchors=anchors,
        )
    problem = health.verdict(unit, port, served_model, result)
    if problem is None and started is not None:
        started(host.name, unit, health.startup(result.startup, formats))
    if problem is None:
        host.noop(f"{unit} healthy on :{port}, serving {served_model}" + (", one token generated" if generates else ""))
    elif hold is not None:
        hold(host.name, problem)
        logger.error(f"{host.print_prefix}{problem}")
        host.noop(f"{unit} not healthy: its batch rolls back")
    else:
        if record is not None:
            record(host.name, problem)
        yield failure(problem)


@operation()
def unit_verified(path: str) -> Generator[str, None, None]:
    """Fail the host when ``systemd-analyze verify`` rejects the unit, before anything starts it."""
    if not host.state.is_executing:
        return
    problems = host.get_fact(UnitProblems, path=path)
    if problems:
        # Moved aside, so that the next run sees the unit as changed and checks it again.
        yield f"mv -f {shlex.quote(path)} {shlex.quote(path + '.rejected')}"
        yield failure(f"{path} fails systemd-analyze verify (kept as {path}.rejected): " + " | ".join(problems[:10]))
    else:
        host.noop(f"{path} passes systemd-analyze verify")


# Runs in the instance's own image, which has huggingface_hub (vLLM downloads with it): prints "<revision> <commit>".
_DOWNLOAD = (
    "import os, sys\n"
    "from huggingface_hub import snapshot_download\n"
    "model, revision, token_path = sys.argv[1:4]\n"
    "token = open(token_path).read().strip() if os.path.isfile(token_path) else None\n"
    "path = snapshot_download(model, revision=revision, token=token)\n"
    "print(revision, os.path.basename(path))\n"
)


@operation(is_idempotent=False)
def weights_downloaded(
    model: str, revision: str, source_root: str, repo: str, image: str, token_path: str | None
) -> Generator[str, None, None]:
    """Download ``model`` into ``weights_source`` with the instance's image, then mark it complete.

    Only the seed host of a model runs it (:func:`instinct_fleet.roll.plan.weight_seeds`),
    and only when the preflight fact found no complete copy there. ``token_path``: the
    host's Hugging Face token file, when preflight found one (gated models need it);
    ``repo``: the model's repository under ``source_root``.
    """
    q = shlex.quote
    run = [
        "docker run --rm --network host",
        f"-v {q(source_root)}:{paths.HF_CACHE_IN_CONTAINER}",
        f"-v {q(token_path)}:{paths.TOKEN_IN_CONTAINER}:ro" if token_path else "",
        f"--entrypoint python3 {q(image)} -c {q(_DOWNLOAD)} {q(model)} {q(revision)} {paths.TOKEN_IN_CONTAINER}",
    ]
    yield (
        f"mkdir -p {q(source_root)} && line=$({' '.join(p for p in run if p)} | tail -n1) && "
        f'[ -n "$line" ] && printf \'%s\\n\' "$line" > {q(repo + "/" + WEIGHTS_COMPLETE)}'
    )


@operation(is_idempotent=False)
def weights_staged(model: str, source: str, local: str, owner: str) -> Generator[str, None, None]:
    """Copy a model's repository from ``weights_source`` into the host's HF cache, then mark the copy.

    ``cp`` merges into what is there (blobs are named by their hash), so a copy cut
    short is finished by the next run; the marker is written last.
    """
    q = shlex.quote
    complete = q(f"{source}/{WEIGHTS_COMPLETE}")
    missing = failure(
        f"{model} is not complete in weights_source ({source}): is weights_source a mount every host shares? "
        "Download it there (or set weights_download = True) and deploy again"
    )
    yield (
        f"if [ ! -s {complete} ]; then {missing}; fi; "
        f"mkdir -p {q(posixpath.dirname(local))} && cp -RP --preserve=mode,timestamps {q(source)} {q(posixpath.dirname(local))}/ && "
        f"chown -R {q(owner)}: {q(local)} && cp {complete} {q(local + '/' + WEIGHTS_STAGED)}"
    )


@operation(is_idempotent=False)
def router_pool_synced(command: str) -> Generator[str, None, None]:
    """Converge a running router's pool to its worker file (``command``: managed.sync_command): a worker that left the
    inventory is removed, a listed one that answers but is missing (an interrupted roll took it out) is added. The
    router stage runs it only where the preflight fact found such a difference (``HostReport.router_drift``)."""
    yield command


def worker_calls(verb: str, members: tuple[Membership, ...], fresh: frozenset[str] = frozenset()) -> str:
    """curl the worker API of every router that lists these instances; the first that cannot be reached fails the host
    (the roll's operations, and tune's trials on the host).

    An instance the host's watch holds out (paths.watch_out) is not put back: the watch does that after its own gate,
    or an operator re-admits it. Only a unit in ``fresh``, which this roll restarted with new serving files that passed
    the gate, gets a fresh start: its watch record and restart budget are cleared first."""
    q = shlex.quote
    calls = []
    for m in members:
        held = q(paths.watch_out(m.unit))
        if verb == "add" and m.unit in fresh:
            calls.append(f"rm -f {held} {q(paths.watch_restarts(m.unit))}")
        elif verb == "add":
            kept = (
                f"{m.unit} ({m.url}) stays out of the pool of the router on {m.router}: the watch holds it out ({paths.watch_out(m.unit)})"
            )
            calls.append(f"if [ -e {held} ]; then echo {q(kept)}; else {_call(verb, m)}; fi")
            continue
        calls.append(_call(verb, m))
    return "; ".join(calls)


def _call(verb: str, m: Membership) -> str:
    """One worker-API call; a router that cannot be reached fails the host with what to do."""
    q = shlex.quote
    url = f"{m.api}/{verb}_worker?url={m.url}"
    what = f"{'take' if verb == 'remove' else 'put'} {m.unit} ({m.url}) {'out of' if verb == 'remove' else 'back into'} the pool of the router on {m.router} ({m.api})"
    fix = (
        "the unit was not stopped and still serves: start the router (or remove router from its host) and deploy again"
        if verb == "remove"
        else "it is healthy but gets no requests through that router until the next deploy adds it"
    )
    # add_worker answers 400 "already exists" for a worker in the pool: that is the state wanted. A router that a
    # change of its own restarted in this run may not listen yet when an instance joins: an add retries a refused
    # connection for up to a minute (a remove does not: the unit must not stop while a router still sends to it).
    retry = "--retry 30 --retry-delay 2 --retry-connrefused " if verb == "add" else ""
    return (
        f"out=$(curl -sS -m 60 {retry}-X POST {q(url)} -w ' HTTP %{{http_code}}' 2>&1); "
        f'case "$out" in *"HTTP 200"|*"already exists"*) echo {q(what)}: "$out";; '
        f"*) printf '%s %s\\n' {q(f'instinct-fleet: could not {what} ({fix}):')} \"$out\" >&2; exit 1;; esac"
    )


@operation(is_idempotent=False)
def router_pools_left(members: tuple[Membership, ...]) -> Generator[str, None, None]:
    """Take this host's stopping instances out of every router pool that lists them, before they stop: from then on
    no new request reaches them, and vLLM's --shutdown-timeout lets the ones in flight finish. Only the roll runs it."""
    yield worker_calls("remove", members)


@operation(is_idempotent=False)
def router_pools_joined(members: tuple[Membership, ...], fresh: frozenset[str] = frozenset()) -> Generator[str, None, None]:
    """Put this host's instances back into every router pool that lists them, after they passed the health gate
    (``fresh``: the units this roll restarted with new serving files; the rest stay out while the watch holds them)."""
    yield worker_calls("add", members, fresh)
