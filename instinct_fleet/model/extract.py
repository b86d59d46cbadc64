#!/usr/bin/env python3
"""Extract the env vars and ``vllm serve`` flags a vLLM release knows, from its own source.

Why: validation must not guess which names a pinned vLLM accepts. vLLM keeps its
env vars in one registry (``vllm/envs.py``: ``environment_variables``) and builds
the ``vllm serve`` parser from ``add_argument`` calls and config dataclasses. This
module reads those files with ``ast`` (it never imports vLLM, which needs a GPU
stack) from a wheel (a zip file: nothing is installed or executed) and returns the
table ``instinct_fleet/model/knowledge/vllm-<version>.json`` holds for the shipped
versions. ``instinct-fleet vllm-facts VERSION`` stores one in a project;
``scripts/extract_vllm_knowledge.py VERSION`` regenerates a shipped one.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import zipfile
from pathlib import Path

from instinct_fleet.model.vllmsource import checks, envs, flags, metrics, platform, routes


def extract(wheel: Path) -> dict[str, object]:
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(zf.namelist())  # the same source gives the same table, whatever order the archive lists it in

        def read(name: str) -> str:
            return zf.read(name).decode()

        envs_py = read("vllm/envs.py")
        types = flags.Types()
        parser_files = ["vllm/engine/arg_utils.py"]
        modules = {name: read(name) for name in names if name.startswith("vllm/") and name.endswith(".py")}
        for text in modules.values():
            types.add_enums(text)
        for name in names:
            if not name.endswith(".py"):
                continue
            if name.startswith("vllm/config/") or name == "vllm/engine/arg_utils.py":
                types.add_module(read(name))
            elif name.startswith("vllm/entrypoints/") and name.endswith("cli_args.py"):
                text = read(name)
                types.add_module(text)
                if "def make_arg_parser" in text:
                    parser_files.append(name)
        served, aliases = flags.serve_flags([read(n) for n in parser_files], types)
        engine, _ = flags.serve_flags([read("vllm/engine/arg_utils.py")], types, frontend=False)
        version = wheel.name.split("-")[1]
        env_vars = envs.env_var_names(envs_py)
        anchored = checks.anchored_checks(modules)
        return {
            "version": version,
            "source": f"{wheel.name}: vllm/envs.py, " + ", ".join(parser_files) + "; reads and enums: every vllm/*.py",
            "env_vars": env_vars,
            "env_unread": envs.unread_env_vars(env_vars, modules),
            "compile_env": envs.compile_env(envs_py, env_vars),
            "flags": served,
            "aliases": aliases,
            # The server's own flags (its parser and FrontendArgs): no engine setting, so no part of the compile cache key.
            "frontend": sorted(set(served) - set(engine)),
            "quantization": platform.quantization_table(modules),
            "attention_backends": platform.attention_backends(modules),
            "mx_architectures": platform.mx_architectures(modules),
            "startup_checks": anchored,
            "startup_conditions": checks.startup_conditions(modules, anchored),
            "executors": checks.executors(modules, envs_py),
            "async_executors": checks.async_executors(modules),
            "exclusive": [
                e for e in flags.exclusive_settings(modules["vllm/engine/arg_utils.py"]) if e["flag"] in served and e["config"] in served
            ],
            "scheduler_defaults": flags.scheduler_defaults(modules["vllm/engine/arg_utils.py"]),
            "startup_log": checks.startup_log(modules),
            "metrics": metrics.prometheus_metrics(modules),
            "histogram_buckets": metrics.histogram_buckets(modules),
            "finish_reasons": metrics.finish_reasons(modules.get("vllm/v1/engine/__init__.py", "")),
            # What the HTTP server answers, and the prefixes --api-key guards: the rest answers without the key.
            "guarded_prefixes": routes.guarded_prefixes(modules),
            "routes": routes.routes(modules),
        }


class ExtractError(Exception):
    """The release cannot be fetched or is not a vLLM wheel; the message says why."""


def download(version: str, directory: Path) -> Path:
    """vLLM's wheel of ``version`` from the package registry, with pip (its dependencies are not fetched, nothing installed)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
            f"vllm=={version}",
            "-d",
            str(directory),
        ],
        capture_output=True,
        text=True,
    )
    wheels = sorted(directory.glob("vllm-*.whl"))
    if done.returncode != 0 or not wheels:
        said = (done.stderr.strip().splitlines() or ["no wheel came back"])[-1]
        raise ExtractError(f"pip could not download vllm=={version}: {said}")
    return wheels[0]


def extract_release(wheel: Path, version: str) -> dict[str, object]:
    """:func:`extract`, refusing a file that is not a vLLM wheel of ``version``."""
    try:
        data = extract(wheel)
    except zipfile.BadZipFile:
        raise ExtractError(f"{wheel} is not a wheel (a zip file)") from None
    except KeyError as exc:
        raise ExtractError(f"{wheel} is not a vLLM wheel: {exc.args[0]}") from None
    except SyntaxError as exc:
        raise ExtractError(f"{wheel}: {exc.filename} does not parse as Python ({exc.msg}, line {exc.lineno})") from None
    if data["version"] != version:
        raise ExtractError(f"{wheel} is vLLM {data['version']}, not {version}")
    return data


# Run inside a vLLM image by ``python3 -c``: the vllm package's Python files as a base64 zip, after its version. The
# package is found without importing it (vLLM's import needs the GPU stack); its version is its distribution's.
IN_IMAGE = """
import base64, importlib.metadata, importlib.util, io, os, sys, zipfile
spec = importlib.util.find_spec("vllm")
if spec is None or not spec.submodule_search_locations:
    sys.exit("no vllm package in this image's python3")
root = list(spec.submodule_search_locations)[0]
buffer = io.BytesIO()
with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):  # a fixed date: an image's files may carry none (mtime 0), which zip cannot hold
                path = os.path.join(folder, name)
                with open(path, "rb") as handle:
                    zf.writestr(zipfile.ZipInfo(os.path.join("vllm", os.path.relpath(path, root)), (1980, 1, 1, 0, 0, 0)), handle.read())
print("version", importlib.metadata.version("vllm"))
print(base64.b64encode(buffer.getvalue()).decode())
"""


def image_command(image: str) -> str:
    """The host command that prints :data:`IN_IMAGE`'s answer from ``image`` (docker on the host, the image pulled)."""
    import shlex

    return f"docker run --rm --network none --entrypoint python3 {shlex.quote(image)} -c {shlex.quote(IN_IMAGE)}"


def from_image(output: str, directory: Path) -> Path:
    """The zip :data:`IN_IMAGE` printed, as a wheel-shaped file that :func:`extract_release` reads."""
    lines = output.strip().splitlines()
    if len(lines) < 2 or not lines[0].startswith("version "):
        raise ExtractError(f"the image did not list its vllm package: {output.strip()[-300:] or 'no output'}")
    version = lines[0].split(" ", 1)[1].strip()
    try:
        data = base64.b64decode("".join(lines[1:]), validate=True)
    except ValueError:
        raise ExtractError("the image's answer was cut off (not base64): run it again") from None
    path = directory / f"vllm-{version}-image.zip"
    path.write_bytes(data)
    return path
