"""The health wait: its output parsed, and the verdict the deploy fails a host with."""

from __future__ import annotations

from instinct_fleet import health

MODELS = '{"object": "list", "data": [{"id": "openai/gpt-oss-120b", "object": "model"}]}'


def text(**parts: str) -> str:
    return "".join(f"{health.MARK}{name}\n{value}\n" for name, value in parts.items())


def test_healthy_instance_serving_its_model() -> None:
    result = health.parse(text(code="200", state="healthy", models=MODELS))
    assert result.models == ("openai/gpt-oss-120b",)
    assert health.verdict("vllm-main.service", 8080, "openai/gpt-oss-120b", result) is None


def test_healthy_but_serving_another_model() -> None:
    result = health.parse(text(code="200", state="healthy", models=MODELS))
    message = health.verdict("vllm-main.service", 8080, "meta-llama/Llama-3.1-70B-Instruct", result)
    assert message == (
        "vllm-main.service: /health answers on :8080 but /v1/models lists ['openai/gpt-oss-120b'], not 'meta-llama/Llama-3.1-70B-Instruct'"
    )


def test_crash_loop_reports_the_journal() -> None:
    journal = "usage: vllm serve [model_tag] [options]\nvllm serve: error: unrecognized arguments: --foo"
    result = health.parse(text(code="000", state="unit restarted while starting (crash loop)", journal=journal))
    message = health.verdict("vllm-main.service", 8080, "m", result)
    assert message is not None
    assert message.startswith("vllm-main.service: not healthy on :8080: unit restarted while starting (crash loop)")
    assert "unrecognized arguments: --foo" in message and "journalctl -u vllm-main.service" in message


def test_garbage_model_listing_is_not_healthy() -> None:
    result = health.parse(text(code="200", state="healthy", models="<html>proxy error</html>"))
    assert result.models == ()
    assert health.verdict("u", 1, "m", result) is not None


def test_wait_script_checks_health_models_and_the_unit() -> None:
    script = health.wait_script("vllm-a b.service", 8001, 60)
    assert "http://127.0.0.1:8001/health" in script and "http://127.0.0.1:8001/v1/models" in script
    assert "'vllm-a b.service'" in script  # quoted for the shell
    assert "no answer within 60s (health_timeout)" in script
