"""The llama405 group of inventories/prod.py: one vLLM instance served by a two-node Ray cluster.

Every host of the group joins the Ray cluster "llama405"; the inventory says which
one is the head. The NIC and RDMA names are examples: take yours from
`ip -br addr` and `ibv_devices` (or `rdma link`) on the nodes.
"""

ray_cluster = "llama405"
vllm_recipe = "llama-3.1-405b-pp2"
vllm_nodes = 2
vllm_instances = [{"name": "llama-405b", "port": 8000}]

# The NIC between the nodes: RCCL and Gloo bootstrap over it, Ray and VLLM_HOST_IP use its address.
cluster_nic = "ens50f0np0"
# RDMA for RCCL across nodes (RoCE v2: GID index 3), GPUDirect RDMA up to the PCIe host bridge.
nccl_ib_hca = "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7"
nccl_ib_gid_index = 3
nccl_net_gdr_level = 3
infiniband = True

# Only the load balancers' network may call the API.
vllm_allow_from = ["10.20.0.0/16"]
