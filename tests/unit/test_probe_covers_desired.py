"""Everything the desired state names is read by the one preflight fact: a gap would drift on every run, or never be removed.

``managed.probe(spec)`` lists what the fact reads from the spec alone; ``managed.desired(plan)``
lists what the host must have once the facts are in. A desired path the probe misses looks
drifted on every run (and is rewritten every time); a must-be-absent path it misses is never
removed. Hypothesis generates specs across the features (the consumer property's host data)
and checks the projection holds for each.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from hypothesis import HealthCheck, given, settings

from instinct_fleet import managed, paths, preflight
from instinct_fleet.paths import RESTART_FILES

from .test_consumers import host_data, plans


def probed(path: str, probe: preflight.Probe) -> bool:
    return path in probe.paths or any(fnmatch.fnmatch(path, glob) for glob in RESTART_FILES)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(host_data)
def test_everything_desired_is_probed(data: dict[str, Any]) -> None:
    accepted = plans(data)
    if accepted is None:
        return
    for plan in accepted:
        probe = managed.probe(plan.spec)
        want = plan.desired
        assert [f.path for f in want.files if not probed(f.path, probe)] == []
        assert [d.path for d in want.directories if not probed(d.path, probe)] == []
        # A stale vllm-*/ray-* unit is found by the fact's patterns; every other unit is named.
        units = [paths.service(u.name) for u in want.units]
        assert [u for u in units if u not in probe.units and not any(fnmatch.fnmatch(u, p) for p in paths.UNIT_PATTERNS)] == []
        assert {(e.port, e.served, e.generates) for e in want.endpoints} <= set(probe.endpoints)
        assert {(w.source, w.local) for w in want.weights} == set(probe.weights)
        assert {i.ref for i in want.images} == set(probe.images)
        assert {t.name for t in want.tables} <= set(probe.tables) and {s.key for s in want.sysctls} <= set(probe.sysctls)
        assert want.user is not None and want.user.name == probe.user
