"""Example production inventory: put in your host names, keep the groups.

Groups are the top-level lists; group_data/<group>.py holds each group's data,
and a (host, {data}) tuple sets data for one host.

Coming from Ansible? Keep your hosts.yml (with its group_vars/ and host_vars/) beside
this file, and make this file these two lines (docs/ansible.md):

from instinct_fleet.model.ansible import groups
globals().update(groups(__file__, "hosts.yml"))
"""

from instinct_fleet.model import gate

# Validate every host before pyinfra connects to any, wherever pyinfra is started from
# (config.py does the same, but pyinfra reads config.py only from the directory it is started in).
gate.install()

# Eight single-GPU gpt-oss-120b instances per host, ports 8080-8087.
gpt_oss_hosts = [
    (
        "mi300x-a01.example.net",
        {
            "vllm_instances": [{"name": f"gpt-oss-{i}", "gpus": [i], "port": 8080 + i} for i in range(8)],
        },
    ),
    # One TP 8 DeepSeek-R1 instance on the whole node.
    ("mi300x-a02.example.net", {"vllm_recipe": "deepseek-r1", "vllm_instances": [{"name": "deepseek-r1"}]}),
]

# Two TP 4 Llama 3.1 70B instances per host.
llama_hosts = [
    (
        "mi300x-b01.example.net",
        {
            "vllm_recipe": "llama-3.1-70b",
            "vllm_instances": [
                {"name": "llama-a", "gpus": [0, 1, 2, 3], "port": 8000},
                {"name": "llama-b", "gpus": [4, 5, 6, 7], "port": 8001},
            ],
        },
    ),
]

# One Llama 3.1 405B (BF16) instance over a two-node Ray cluster: TP 8 inside each node,
# PP 2 across them. The cluster's settings (NIC, RCCL, allow-list) are in group_data/llama405.py.
llama405 = [
    ("mi300x-c01.example.net", {"ray_role": "head"}),
    ("mi300x-c02.example.net", {"ray_role": "worker"}),
]
