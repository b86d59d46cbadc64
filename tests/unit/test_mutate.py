"""scripts/mutate.py's table stays in step with the code: every anchor is there once, every test it names exists,
and a planted mutation is put back byte for byte."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def mutate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutate", ROOT / "scripts" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutate"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_mutation_names_code_that_is_there_once_and_tests_that_exist() -> None:
    table = mutate().MUTATIONS
    assert len({m.name for m in table}) == len(table) >= 10
    for m in table:
        assert (ROOT / m.path).read_text().count(m.old) == 1, m.name
        assert m.old != m.new
        for test in m.tests:
            assert (ROOT / test.split("::")[0]).is_file(), (m.name, test)
    # The verdict code the issue names: noise, canary, report, validation.
    assert {m.path.rsplit("/", 1)[-1] for m in table} >= {"noise.py", "canary.py", "report.py", "validate.py"}


def test_a_planted_mutation_is_put_back_and_a_surviving_one_is_reported(tmp_path: Path) -> None:
    module = mutate()
    target = tmp_path / "code.py"
    target.write_bytes(b"VALUE = 1\r\n")
    (tmp_path / "test_code.py").write_text("def test_value():\n    assert True\n")
    module.ROOT = tmp_path
    survived = module.Mutation("harmless to its test", "code.py", "VALUE = 1", "VALUE = 2", ("test_code.py",))
    assert module.plant(survived) == "SURVIVED" and target.read_bytes() == b"VALUE = 1\r\n"
    (tmp_path / "test_code.py").write_text(
        "from pathlib import Path\n\ndef test_value():\n    assert '= 1' in Path('code.py').read_text()\n"
    )
    assert module.plant(survived) == "killed" and target.read_bytes() == b"VALUE = 1\r\n"
    assert module.plant(module.Mutation("gone", "code.py", "VALUE = 3", "VALUE = 4", ("test_code.py",))) == "anchor gone"
