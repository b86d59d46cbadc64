"""STAND-IN for huggingface_hub's ``snapshot_download``, for the simulated fleet only (no hub is reachable here).

It writes the cache layout huggingface_hub writes (refs/<revision>, blobs named by
their hash, snapshots/<commit>/ with relative links into blobs) for a small
synthetic model, so that weight staging copies and checks a real tree. A gated repo
(Meta's Llama models) answers as the Hub does: 401 without the token the Hub accepts,
or with another one (the fleet bakes the accepted token into the image).
"""

from __future__ import annotations

import hashlib
import json
import os

BLOB_BYTES = 4 * 1024 * 1024  # one "weights" shard of 4 MiB
GATED = ("meta-llama/",)  # repos the Hub serves only to an accepted token
ACCEPTED = "/usr/share/instinct-fleet-standin/hub-token"  # the token the stand-in Hub accepts


class GatedRepoError(OSError):
    """As huggingface_hub raises it for a gated repo the token may not read (HTTP 401)."""


def _authorized(repo_id: str, token: str | None) -> None:
    if not repo_id.startswith(GATED):
        return
    with open(ACCEPTED) as handle:
        accepted = handle.read().strip()
    if token is None or token.strip() != accepted:
        raise GatedRepoError(
            f"401 Client Error. Cannot access gated repo for url https://huggingface.co/api/models/{repo_id}/revision/main. "
            f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. "
            f"({'no token' if token is None else 'the token is not accepted'})"
        )


def snapshot_download(repo_id: str, revision: str | None = None, cache_dir: str | None = None, token: str | None = None) -> str:
    _authorized(repo_id, token)
    revision = revision or "main"
    root = cache_dir or os.path.join(os.environ.get("HF_HOME", "/root/.cache/huggingface"), "hub")
    repo = os.path.join(root, "models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    files = {
        "config.json": json.dumps({"_name_or_path": repo_id, "architectures": ["StandInForCausalLM"]}).encode(),
        "model.safetensors": hashlib.sha256(repo_id.encode()).digest() * (BLOB_BYTES // 32),
    }
    os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
    snapshot = os.path.join(repo, "snapshots", commit)
    os.makedirs(snapshot, exist_ok=True)
    for name, content in files.items():
        blob = hashlib.sha256(content).hexdigest()
        with open(os.path.join(repo, "blobs", blob), "wb") as handle:
            handle.write(content)
        link = os.path.join(snapshot, name)
        if not os.path.islink(link):
            os.symlink(os.path.join("..", "..", "blobs", blob), link)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", revision), "w") as handle:
        handle.write(commit)
    print(f"stand-in huggingface_hub: {repo_id}@{revision} ({commit}) {'with' if token else 'without'} a token", flush=True)
    return snapshot
