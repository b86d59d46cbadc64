"""Stage 9, health: each instance is healthy (/health, its model listed, one token generated) within health_timeout.

Instances that rolled passed this gate in their batch already; this is the
final word for the others: every instance that did not answer at preflight.
"""

from pyinfra.context import host

from instinct_fleet.fleet import serving
from instinct_fleet.fleet.run import plan_for

serving.healthy(plan_for(host))
