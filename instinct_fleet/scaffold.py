"""``instinct-fleet init DIR``: a starting infra repo that uses the installed package, and nothing from a clone.

It writes the example project shipped in ``instinct_fleet/project`` (``deploy.py``, ``config.py``,
``inventories/prod.py``, ``group_data/llama405.py``) and ``group_data/all.py`` with every variable
commented out at its default, with its meaning: the package's defaults apply until a line is
uncommented, so upgrading the package moves the defaults a project has not chosen. A file that
exists is never overwritten, so running it twice, or over a project, changes nothing.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from instinct_fleet.model.defaults import VARIABLES

ALL_HEADER = '''"""Fleet-wide settings: every instinct-fleet variable, {state}.

pyinfra reads this file for every host; group files (group_data/<group>.py) and
host data in the inventory override it. instinct_fleet/model/defaults.py defines
each default; docs/reference/variables.md lists the same variables.
"""
'''


def group_data_all(commented: bool) -> str:
    """group_data/all.py: each variable with its meaning, set to its default, or (``commented``) left to the package's default."""
    blocks = []
    for v in VARIABLES:
        comment = "\n".join(textwrap.wrap(v.doc, width=96, initial_indent="# ", subsequent_indent="# "))
        blocks.append(f"{comment}\n{'# ' if commented else ''}{v.name} = {v.default!r}")
    state = "commented out at its default: uncomment a line to choose" if commented else "at its default"
    return ALL_HEADER.format(state=state) + "\n" + "\n\n".join(blocks) + "\n"


@dataclass(frozen=True)
class Written:
    path: Path
    kept: bool  # True: the file was there already and is left as it was


def _shipped(root: Traversable, prefix: str = "") -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for entry in root.iterdir():
        name = f"{prefix}{entry.name}"
        if entry.is_dir():
            if entry.name != "__pycache__":
                files |= _shipped(entry, f"{name}/")
        else:
            files[name] = entry.read_bytes()
    return files


def project_files() -> dict[str, bytes]:
    """Every file ``init`` writes, by its path in the project."""
    files = _shipped(resources.files("instinct_fleet").joinpath("project"))
    files["group_data/all.py"] = group_data_all(commented=True).encode()
    return dict(sorted(files.items()))


def init(directory: Path) -> list[Written]:
    """Write the project into ``directory`` (made if missing); keep every file that exists."""
    done = []
    for name, content in project_files().items():
        path = directory / name
        if path.exists():
            done.append(Written(path, kept=True))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("xb") as out:  # "x": a file that appeared since the check is still never overwritten
            out.write(content)
        done.append(Written(path, kept=False))
    return done
