"""Stage 4, model weights (only with weights_source): each model copied into the host's HF cache before its first start.

A model missing from weights_source is downloaded there once per fleet, by one
host, with the instance's own image; a barrier holds the other hosts until it is
there, then every host copies it (instinct_fleet/fleet/run.py:weight_seeds).
"""

from pyinfra.context import host

from instinct_fleet.converge import apply, operations
from instinct_fleet.fleet.run import fleet_plan

fleet = fleet_plan(host.state)
plan = fleet.plans[host.name]
v = plan.spec.vars
weights = plan.desired.weights

missing = [w for w in weights if not plan.source_has(w)]
if missing and not plan.spec.vars.weights_download:
    names = ", ".join(w.model for w in missing)
    operations.fail(
        name="Weights in weights_source",
        message=f"{names} not complete in weights_source ({plan.spec.vars.weights_source}) and weights_download is False: "
        "copy the model there (hf download, then write its revision and commit to .instinct-fleet-complete) or set weights_download = True",
    )
else:
    for w in host.loop([w for w in missing if fleet.weight_seeds.get(w.source) == host.name]):
        operations.weights_downloaded(
            name=f"Download {w.model} into weights_source (once for the fleet)",
            model=w.model,
            revision=w.revision,
            source_root=str(plan.spec.vars.weights_source),
            repo=w.source,
            image=plan.image,
            token_path=v.hf_token_path if plan.report.hf_token else None,
            _timeout=v.image_pull_timeout,
        )
    if missing:
        operations.barrier(name="Weights: every missing model is in weights_source", note="weight downloads done")
    apply.converge(plan, "weights")  # each model copied into the host's cache, by the one applier
