"""Each recipe holds the launch command of its seed: same env vars, same flags, same values.

The commands below are read from the seeds the package ships (tests/unit/seed_text.py: continuations
joined, the `export` lines above a command as its prefixes), not copied. Settings that the pinned vLLM
spells differently must be listed in the recipe's ``translated`` table, so nothing is lost silently.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from instinct_fleet.model import knowledge
from instinct_fleet.model.defaults import DEFAULTS
from instinct_fleet.model.recipes import all_recipes
from instinct_fleet.model.render import render_args, service_json
from instinct_fleet.model.spec import canonical_arg
from tests.unit.launch import LaunchCommand, parse_launch_command
from tests.unit.seed_text import occurrences

from .conftest import check, check_cluster

VERSION = DEFAULTS["vllm_version"]
SEEDS = Path(str(resources.files("instinct_fleet.model").joinpath("knowledge", "seeds")))


def seed_command(seed: str, line: int) -> str:
    """The seed's own command whose `vllm serve` is on ``line``, as tests/unit/seed_text.py reads it."""
    (path,) = SEEDS.glob(f"{seed}_*.txt")
    (text,) = [o.text for o in occurrences(path) if o.line == line and not o.prose]
    return text


SEED_000 = seed_command("000", 9)
SEED_001 = seed_command("001", 33)
SEED_004 = seed_command("004", 273)
SEED_002_PP = seed_command("002", 185)
SEED_002_MLA = seed_command("002", 112)
SEED_002_DPEP = seed_command("002", 239)
SEED_002_DSA = seed_command("002", 108)
SEED_002_VL = seed_command("002", 282)
SEED_002_FA = seed_command("002", 117)
SEED_002_PTPC = seed_command("002", 470)
SEED_002_EAGLE = seed_command("002", 561)
SEED_002_AWQ = seed_command("002", 488)
SEED_004_405B = seed_command("004", 336)


def rendered(recipe: str) -> dict[str, object]:
    nodes = all_recipes()[recipe].nodes
    if nodes > 1:
        planned = check_cluster({"vllm_recipe": recipe, "vllm_nodes": nodes}, nodes)
        spec = planned[0][0]
        findings = [f for _, fs in planned for f in fs]
    else:
        spec, findings = check({"vllm_recipe": recipe})
    assert [str(f) for f in findings] == [], "a built-in recipe must validate cleanly"
    return service_json(spec.services[0])


def flag_pairs(argv: list[str]) -> dict[str, str | None]:
    pairs: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            pairs[argv[i]] = argv[i + 1]
            i += 2
        else:
            pairs[argv[i]] = None
            i += 1
    return pairs


def argv_pairs(parsed: LaunchCommand, table: knowledge.VllmKnowledge) -> dict[str, str | None]:
    """A parsed command's flags as the rendered argv spells them: ``--flag value``, ``--flag`` or ``--no-flag``."""
    args: dict[str, str | None] = {}
    for name, value in parsed.args.items():
        flag = canonical_arg(name, table)
        if value is True:
            args[f"--{flag}"] = None
        elif value is False:
            args[f"--no-{flag}"] = None
        else:
            args[f"--{flag}"] = str(value)
    return args


def seed_pairs(command: str) -> tuple[dict[str, str], str | None, dict[str, str | None]]:
    parsed = parse_launch_command(command, VERSION)
    return parsed.env, parsed.model, argv_pairs(parsed, _table())


@pytest.mark.parametrize(
    ("recipe", "command"),
    [
        ("llama-3.1-405b-pp2", SEED_002_PP),
        ("deepseek-r1", SEED_002_MLA),
        ("deepseek-v3.2", SEED_002_DSA),
        ("qwen3-vl", SEED_002_VL),
        ("llama-3.3-70b-fp8", SEED_002_FA),
        ("llama-3.1-70b-awq", SEED_002_AWQ),
    ],
)
def test_recipe_contains_seed_exactly(recipe: str, command: str) -> None:
    out = rendered(recipe)
    env, model, args = seed_pairs(command)
    assert out["model"] == model
    assert {k: out["env"][k] for k in env} == env  # type: ignore[index]
    got = flag_pairs(out["vllm_args"])  # type: ignore[arg-type]
    assert {k: got.get(k, "MISSING") for k in args} == args


def test_gpt_oss_120b_is_exactly_the_seed_but_quick_reduce() -> None:
    out = rendered("gpt-oss-120b")
    env, _, args = seed_pairs(SEED_000)
    # Quick reduce does nothing at TP 1 (no device communicator at world size 1): translated away, with its reason.
    assert env.pop("VLLM_ROCM_QUICK_REDUCE_QUANTIZATION") == "INT4"
    assert [t.seed for t in all_recipes()["gpt-oss-120b"].translated] == ["VLLM_ROCM_QUICK_REDUCE_QUANTIZATION=INT4"]
    assert out["env"] == env and len(env) == 3
    assert (
        flag_pairs(out["vllm_args"]) == args and len(args) == 9
    )  # the issue says "ten": nine flags plus the model; type: ignore[arg-type]
    assert out["port"] == 8080 and out["gpus"] == [0]


@pytest.mark.parametrize(
    ("recipe", "command"),
    [
        ("gpt-oss-120b", SEED_000),
        ("gpt-oss-120b-unified", SEED_001),
        ("llama-3.1-70b", SEED_004),
        ("deepseek-r1-dp-ep", SEED_002_DPEP),
        ("llama-3.1-8b-eagle3", SEED_002_EAGLE),
        ("llama-3.1-405b-fp8", SEED_004_405B),
    ],
)
def test_translated_recipe_keeps_or_documents_every_seed_setting(recipe: str, command: str) -> None:
    out = rendered(recipe)
    translated = set()
    for t in all_recipes()[recipe].translated:
        first = t.seed.split("=")[0].split(" ")[0]
        translated |= {first, "--" + canonical_arg(first, _table()), t.seed}
    env, model, args = seed_pairs(command)
    assert out["model"] == model or str(model).split("/")[-1] in translated
    for name, value in env.items():
        assert out["env"].get(name) == value or name in translated, name  # type: ignore[attr-defined]
    got = flag_pairs(out["vllm_args"])  # type: ignore[arg-type]
    for flag, value in args.items():
        full = flag.replace("--no-", "--")
        kept = got.get(flag, "MISSING") == value
        assert kept or flag in translated or full in translated, flag


RENDERED = {
    # recipe -> the exact env and argv it renders (after the model), so a change to a recipe is a change to this table
    "deepseek-v3.2": (
        {"VLLM_ROCM_USE_AITER": "1", "NCCL_MIN_NCHANNELS": "112"},
        "--tensor-parallel-size 8 --block-size 1 --port 8000",
    ),
    "qwen3-vl": (
        {"VLLM_ROCM_USE_AITER": "1", "NCCL_MIN_NCHANNELS": "112"},
        "--tensor-parallel-size 8 --mm-encoder-tp-mode data --enable-expert-parallel --max-model-len 32768 --port 8000",
    ),
    "llama-3.3-70b-fp8": (
        {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1", "TORCH_BLAS_PREFER_HIPBLASLT": "1"},
        "--attention-backend ROCM_AITER_FA --quantization fp8 --dtype auto --kv-cache-dtype fp8 --tensor-parallel-size 1 "
        "--gpu-memory-utilization 0.92 --max-model-len 8192 --port 8000",
    ),
    "llama-3.1-8b-eagle3": (
        {},
        "--trust-remote-code --tensor-parallel-size 1 --distributed-executor-backend mp --dtype float16 --quantization fp8 "
        "--kv-cache-dtype fp8 --no-enable-chunked-prefill --max-num-seqs 300 --max-num-batched-tokens 131072 "
        "--gpu-memory-utilization 0.8 --speculative-config "
        '{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 2, '
        '"draft_tensor_parallel_size": 1} --port 8001',
    ),
    "llama-3.1-70b-awq": (
        {"VLLM_USE_TRITON_AWQ": "1"},
        "--quantization awq --tensor-parallel-size 1 --dtype auto --port 8000",
    ),
    "llama-3.1-405b-fp8": (
        {"VLLM_ROCM_USE_AITER": "1", "NCCL_MIN_NCHANNELS": "112", "TORCH_BLAS_PREFER_HIPBLASLT": "1"},
        "--tensor-parallel-size 8 --attention-backend ROCM_AITER_FA --no-enable-chunked-prefill --max-num-seqs 1024 --port 8000",
    ),
}


@pytest.mark.parametrize("recipe", sorted(RENDERED))
def test_new_seed_recipes_render_exactly(recipe: str) -> None:
    out = rendered(recipe)
    env, argv = RENDERED[recipe]
    assert out["env"] == env
    assert out["vllm_args"] == _split(argv)


def _split(argv: str) -> list[str]:
    """The argv a flag string stands for; the JSON value of --speculative-config is one word."""
    if "{" not in argv:
        return argv.split()
    head, rest = argv.split(" {", 1)
    body, tail = rest.rsplit("} ", 1)
    return [*head.split(), "{" + body + "}", *tail.split()]


def test_every_recipe_validates_cleanly_on_every_version_it_can_run() -> None:
    for name, recipe in all_recipes().items():
        if recipe.nodes > 1:
            planned = check_cluster({"vllm_recipe": name, "vllm_nodes": recipe.nodes}, recipe.nodes)
            findings = [f for _, fs in planned for f in fs]
        else:
            findings = check({"vllm_recipe": name})[1]
        assert [str(f) for f in findings] == [], name


def test_llama_recipes_select_aiter_flash_attention_explicitly() -> None:
    # 0.22.0's ROCm backend priority puts ROCM_ATTN first for MHA models, AITER or not.
    for name in ("llama-3.1-70b", "llama-3.1-405b-fp8", "llama-3.3-70b-fp8"):
        argv = rendered(name)["vllm_args"]
        assert argv[argv.index("--attention-backend") + 1] == "ROCM_AITER_FA", name  # type: ignore[union-attr]


def test_unified_recipe_uses_the_backend_the_newest_guide_gives() -> None:
    out = rendered("gpt-oss-120b-unified")
    argv = out["vllm_args"]
    assert argv[argv.index("--attention-backend") + 1] == "ROCM_AITER_UNIFIED_ATTN"  # type: ignore[union-attr]
    assert argv[argv.index("--compilation-config") + 1] == '{"cudagraph_mode": "FULL"}'  # type: ignore[union-attr]
    assert out["port"] == 8000


def test_profiles_differ_from_base_only_where_000_says() -> None:
    base = flag_pairs(rendered("gpt-oss-120b")["vllm_args"])  # type: ignore[arg-type]
    low = flag_pairs(rendered("gpt-oss-120b-low-latency")["vllm_args"])  # type: ignore[arg-type]
    batch = flag_pairs(rendered("gpt-oss-120b-batch")["vllm_args"])  # type: ignore[arg-type]
    assert {k for k in base if base[k] != low.get(k)} == {"--max-num-seqs"}
    assert 8 <= int(low["--max-num-seqs"] or 0) <= 32
    assert {k for k in base if base[k] != batch.get(k)} == {"--max-num-seqs", "--gpu-memory-utilization"}
    assert batch["--max-num-seqs"] == "1024" and 0.94 <= float(batch["--gpu-memory-utilization"] or 0) <= 0.95


def test_every_recipe_names_its_seed_and_a_reason_for_each_setting() -> None:
    for recipe in all_recipes().values():
        assert recipe.source.split("_")[0] in {"000", "001", "002", "003", "004"}, recipe.name
        for setting in [*recipe.env.values(), *recipe.args.values()]:
            assert setting.why.strip(), recipe.name


@pytest.mark.parametrize(
    "command",
    [
        SEED_000,
        SEED_001,
        SEED_004,
        SEED_002_PP,
        SEED_002_MLA,
        SEED_002_DPEP,
        SEED_002_DSA,
        SEED_002_PTPC,
        SEED_004_405B,
        "CUDA_VISIBLE_DEVICES=2,3 vllm serve /path/to/model --dtype float16 --tensor-parallel-size 2 --port 8001",
        "VLLM_ROCM_USE_AITER=1 VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1 vllm serve meta-llama/Llama-3.3-70B-Instruct "
        "--attention-backend ROCM_AITER_FA",
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --trust-remote-code --swap-space 16 --disable-log-requests "
        "--tensor-parallel-size 1 --distributed-executor-backend mp --dtype float16 --quantization fp8 --kv-cache-dtype fp8 "
        "--no-enable-chunked-prefill --max-num-seqs 300 --max-num-batched-tokens 131072 --gpu-memory-utilization 0.8 "
        '--speculative_config \'{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", '
        '"num_speculative_tokens": 2, "draft_tensor_parallel_size": 1, "dtype": "float16"}\' --port 8001',
        "VLLM_USE_TRITON_AWQ=1 vllm serve hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4 --quantization awq "
        "--tensor-parallel-size 1 --dtype auto",
        "vllm serve Qwen/Qwen3-VL-235B-A22B-Instruct --tensor-parallel-size 8 --mm-encoder-tp-mode data "
        "--enable-expert-parallel --max-model-len 32768",
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --kv-cache-dtype fp8 --calculate-kv-scales --gpu-memory-utilization 0.90",
    ],
)
def test_every_seed_command_is_expressible(command: str) -> None:
    """Parse a seed command into spec data and render it back: nothing is lost."""
    parsed = parse_launch_command(command, VERSION)
    port = int(str(parsed.args.pop("port", 8000)))
    data = {
        "vllm_recipe": None,
        "vllm_model": parsed.model,
        "vllm_env": parsed.env,
        "vllm_args": parsed.args,
        "vllm_instances": [{"name": "seed", "port": port}],
    }
    spec, _ = check(data)
    svc = spec.services[0]
    assert svc.model == parsed.model
    assert svc.env == parsed.env
    argv = render_args(svc)
    for name, value in parsed.args.items():
        flag = canonical_arg(name, _table())
        if value is False:
            assert f"--no-{flag}" in argv
        elif value is True:
            assert f"--{flag}" in argv
        else:
            assert argv[argv.index(f"--{flag}") + 1] == str(value)
    assert argv[-2:] == ["--port", str(port)]


def _table() -> knowledge.VllmKnowledge:
    return knowledge.load(VERSION)
