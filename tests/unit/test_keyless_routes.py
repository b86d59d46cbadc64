"""Which routes vLLM serves without its API key, read from its source, and what plan says of a keyed port open to more
than its routers."""

from __future__ import annotations

import pytest

from instinct_fleet.model import knowledge
from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.model.vllmsource import routes

MIDDLEWARE_011 = """
class AuthenticationMiddleware:
    def __call__(self, scope, receive, send):
        url_path = URL(scope=scope).path.removeprefix(root_path)
        if url_path.startswith("/v1") and not self.verify_token(headers):
            return JSONResponse(content={"error": "Unauthorized"}, status_code=401)
"""
MIDDLEWARE_033 = """
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")

class AuthenticationMiddleware:
    def __call__(self, scope, receive, send):
        if url_path.startswith(GUARDED_PREFIX) and not self.verify_token(headers):
            pass
"""
ROUTERS = """
router = APIRouter()

@router.post(
    "/v1/chat/completions",
    dependencies=[Depends(validate_json_request)],
)
async def chat(raw_request): ...

@router.post("/tokenize")
async def tokenize(raw_request): ...

@router.get("/health")
async def health(raw_request): ...

@router.api_route("/ping", methods=["GET", "POST"])
async def ping(raw_request): ...

router.add_api_route("/inference/v1/abort_requests", abort, methods=["POST"])
metrics_route = Mount("/metrics", make_asgi_app(registry=registry))
"""


def test_the_guarded_prefixes_are_read_from_either_form_of_the_middleware() -> None:
    assert routes.guarded_prefixes({"vllm/entrypoints/openai/api_server.py": MIDDLEWARE_011}) == ["/v1"]
    assert routes.guarded_prefixes({"vllm/entrypoints/serve/middleware/authenticate.py": MIDDLEWARE_033}) == [
        "/v1",
        "/v2",
        "/inference",
        "/cohere",
    ]
    assert routes.guarded_prefixes({"vllm/entrypoints/x.py": "def f(): pass\n"}) == []


def test_every_declared_route_is_read_and_those_outside_the_guarded_prefixes_are_keyless() -> None:
    found = routes.routes({"vllm/entrypoints/openai/api_router.py": ROUTERS, "vllm/other/mod.py": ROUTERS})
    assert {(r["path"], tuple(r["methods"])) for r in found} == {
        ("/v1/chat/completions", ("POST",)),
        ("/tokenize", ("POST",)),
        ("/health", ("GET",)),
        ("/ping", ("GET", "POST")),
        ("/inference/v1/abort_requests", ("POST",)),
        ("/metrics", ("*",)),
    }
    assert all(r["module"] == "vllm/entrypoints/openai/api_router.py" for r in found)  # only the server's modules
    assert routes.keyless(found, ["/v1", "/v2", "/inference"]) == ["/health", "/metrics", "/ping", "/tokenize"]


@pytest.mark.parametrize("version", knowledge.supported_versions())
def test_each_shipped_table_knows_the_keyless_routes_of_its_version(version: str) -> None:
    """Read from the wheels (scripts/extract_vllm_knowledge.py): the OpenAI routes are guarded, the rest are not."""
    table = knowledge.load(version)
    assert "/v1" in table.guarded_prefixes
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/health", "/metrics"} <= set(table.routes)
    assert {"/tokenize", "/detokenize", "/health", "/metrics", "/invocations", "/pooling"} <= set(table.keyless_routes)
    assert not any(r.startswith("/v1") for r in table.keyless_routes)


def _warned(peers: dict[str, dict[str, object]]) -> dict[str, str]:
    found = {}
    for spec, findings in plan_hosts([HostData(name, (), data) for name, data in peers.items()]):
        found.update({str(spec.host): f.message for f in findings if f.rule == "api-key-keyless-routes"})
    return found


def test_a_keyed_port_open_beyond_its_routers_is_warned_with_the_routes_of_its_version() -> None:
    key = {"vllm_api_key_path": "/etc/instinct-fleet/api-key", "scrape_address": "10.0.0.2"}
    # Alone, keyed: its port answers anyone on /tokenize and the rest.
    alone = _warned({"h": key})
    assert "/tokenize" in alone["h"] and "answer anyone" in alone["h"]
    # In a pool, vllm_allow_from unset: its routers alone reach it, nothing to say.
    router = {"router": True, "scrape_address": "10.0.0.1", "vllm_instances": []}
    assert _warned({"r": router, "h": key}) == {}
    # In a pool, but vllm_allow_from opens it to clients as well: they reach the keyless routes.
    opened = _warned({"r": router, "h": {**key, "vllm_allow_from": ["10.0.0.1", "10.9.0.0/16"]}})
    assert "10.9.0.0/16" in opened["h"] and "/pause" in opened["h"]
    # No key: no such warning (the port is the model's, key or not).
    assert _warned({"h": {"scrape_address": "10.0.0.2"}}) == {}
