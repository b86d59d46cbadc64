"""Secrets the control machine hands to the hosts: where each comes from, read the one way every stage reads it.

The Hugging Face token (``hf_token_source``) is read on the control machine, from an environment
variable of the command or a file, and written by the deploy to ``hf_token_path`` on each host, root's
alone. It is read when it is needed and never kept in a spec, a plan's text or a finding: a message
names where the token comes from, never the token.
"""

from __future__ import annotations

import os
import re

from instinct_fleet.model.spec import HostSpec

ENV_PREFIX = "env:"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def hf_token(spec: HostSpec) -> tuple[str | None, str | None]:
    """The token ``hf_token_source`` names, and what is wrong with it: (token, None), (None, why), or (None, None) when
    the token is not managed."""
    source = spec.vars.hf_token_source
    if source is None:
        return None, None
    if source.startswith(ENV_PREFIX):
        name = source[len(ENV_PREFIX) :]
        if not ENV_NAME.match(name):
            return None, f"{source!r}: after env: comes the name of an environment variable, such as env:HF_TOKEN"
        value = os.environ.get(name)
        if value is None:
            return None, f"the environment variable {name} is not set for this command: export it where instinct-fleet or pyinfra runs"
        where = f"the environment variable {name}"
    else:
        path = spec.local(source)
        try:
            value = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            return None, f"cannot read {path} on this machine: {getattr(exc, 'strerror', None) or exc}"
        where = str(path)
    token = value.strip()
    if not token:
        return None, f"{where} is empty: it must hold the token"
    if re.search(r"[\s\x00-\x1f\x7f]", token):
        return None, f"{where} holds more than one token: whitespace or a control character inside it"
    return token, None
