"""What a run is asked to do beyond converging, passed as one pyinfra argument: ``--data instinct_fleet_run=JSON``.

``instinct-fleet rollback``, ``warm``, ``quarantine``, ``admit`` and ``deploy --json`` are each a deploy with one
of these set; plain pyinfra takes the same argument, so what the command line runs can be typed by hand. pyinfra
keeps ``--data`` values as data of every host; the run reads this one key from the inventory's override data, and
the host data the variables are validated from never holds it (:func:`instinct_fleet.model.inventory.hosts_of`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from instinct_fleet.converge.gpuhealth import Ask
from instinct_fleet.model.inventory import RUN_MODE_KEY

FORM = (
    '{"restore": "previous" or "N", "warm": true, "quarantine": {"HOST": [GPU or null, "reason"]}, "admit": ["HOST"], '
    '"summary": "/path/roll.json"}, each key optional'
)


@dataclass(frozen=True)
class RunMode:
    """``restore``: the generation ``rollback`` puts back ("previous" or a number); ``warm``: an ``instinct-fleet warm``
    run (one start per compile configuration, its cache spread); ``ask``: an operator's quarantine or admit;
    ``summary``: the file the roll summary is written to as JSON (``deploy --json``)."""

    restore: str | None = None
    warm: bool = False
    ask: Ask = field(default_factory=Ask)
    summary: str | None = None

    def argument(self) -> list[str]:
        """pyinfra's arguments that hand this mode to the run: none for a plain deploy."""
        data: dict[str, Any] = {}
        if self.restore is not None:
            data["restore"] = self.restore
        if self.warm:
            data["warm"] = True
        if self.ask.quarantine:
            data["quarantine"] = {h: list(v) for h, v in self.ask.quarantine.items()}
        if self.ask.admit:
            data["admit"] = sorted(self.ask.admit)
        if self.summary is not None:
            data["summary"] = self.summary
        return ["--data", f"{RUN_MODE_KEY}={json.dumps(data)}"] if data else []

    @classmethod
    def of_data(cls, value: object) -> RunMode:
        """The mode as :meth:`argument` wrote it (pyinfra parses the JSON); what a person typed wrong is refused, with the
        form it must have."""
        if value is None:
            return cls()
        try:
            if not isinstance(value, dict) or set(value) - {"restore", "warm", "quarantine", "admit", "summary"}:
                raise ValueError("not an object of the keys below")
            if not isinstance(value.get("warm", False), bool):
                raise ValueError(f"warm is {value['warm']!r}, not true or false")
            restore = value.get("restore")
            if restore is not None and not (str(restore) == "previous" or str(restore).isdigit()):
                raise ValueError(f"restore is {restore!r}")
            asked = {str(h): (None if v[0] is None else int(v[0]), str(v[1])) for h, v in value.get("quarantine", {}).items()}
            admit = frozenset(str(h) for h in value.get("admit", ()))
            summary = value.get("summary")
            return cls(None if restore is None else str(restore), value.get("warm", False), Ask(asked, admit), summary and str(summary))
        except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
            raise ValueError(f"--data {RUN_MODE_KEY}={json.dumps(value)} is not {FORM}: {exc}") from exc
