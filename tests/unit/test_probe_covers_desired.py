"""Everything the desired state names is read by the one preflight fact: a gap would drift on every run, or never be removed.

``evaluate.probe(spec)`` lists what the fact reads from the spec alone; ``evaluate.desired(plan)``
lists what the host must have once the facts are in. A desired path the probe misses looks
drifted on every run (and is rewritten every time); a must-be-absent path it misses is never
removed. Hypothesis generates specs across the features (the consumer property's host data)
and checks the projection holds for each.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from instinct_fleet.converge import evaluate, probe
from instinct_fleet.model import paths
from instinct_fleet.model.paths import PROBED_GLOBS

from .test_consumers import assert_reached, plans


def probed(path: str, reads: probe.Probe) -> bool:
    return path in reads.paths or any(fnmatch.fnmatch(path, glob) for glob in PROBED_GLOBS)


def covered(data: dict[str, Any]) -> bool:
    """Check the projection for an accepted configuration; False when validation refuses the data."""
    accepted = plans(data)
    if accepted is None:
        return False
    for plan in accepted:
        reads = evaluate.probe(plan.spec)
        want = plan.desired
        assert [f.path for f in want.files if not probed(f.path, reads)] == []
        assert [d.path for d in want.directories if not probed(d.path, reads)] == []
        # A stale vllm-*/ray-* unit is found by the fact's patterns; every other unit is named.
        units = [paths.service(u.name) for u in want.units]
        assert [u for u in units if u not in reads.units and not any(fnmatch.fnmatch(u, p) for p in paths.PROBED_PATTERNS)] == []
        assert {(e.port, e.served, e.generates) for e in want.endpoints} <= set(reads.endpoints)
        assert {(w.source, w.local) for w in want.weights} == set(reads.weights)
        assert {i.ref for i in want.images} == set(reads.images)
        assert {t.name for t in want.tables} <= set(reads.tables) and {s.key for s in want.sysctls} <= set(reads.sysctls)
        assert want.user is not None and want.user.name == reads.user
    return True


def test_everything_desired_is_probed() -> None:
    assert_reached(covered, 150, "were accepted and checked")
