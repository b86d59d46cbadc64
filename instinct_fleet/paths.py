"""Where instinct-fleet writes on a host: the paths the deploy, the preflight fact and the verify module share."""

from __future__ import annotations

CONFIG_DIR = "/etc/instinct-fleet"
SYSTEMD_DIR = "/etc/systemd/system"
DAEMON_JSON = "/etc/docker/daemon.json"
DOCKER_DROP_IN = f"{SYSTEMD_DIR}/docker.service.d/90-instinct-fleet.conf"

# Weight staging: written after a complete download into weights_source ("<revision> <commit>"),
# and after a complete copy into hf_cache_dir (the same line), so that a cut copy never counts.
WEIGHTS_COMPLETE = ".instinct-fleet-complete"
WEIGHTS_STAGED = ".instinct-fleet-staged"

# Files whose change restarts a serving unit; the preflight fact hashes them (roll.py).
RESTART_FILES = (
    f"{SYSTEMD_DIR}/vllm-*.service",
    f"{SYSTEMD_DIR}/ray-*.service",
    f"{CONFIG_DIR}/*.env",
    DAEMON_JSON,
    DOCKER_DROP_IN,
)
