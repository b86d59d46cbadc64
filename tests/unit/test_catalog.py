"""A project's own recipes and vLLM tables: found, validated like the shipped ones, and refused with the file when wrong."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from instinct_fleet import scaffold
from instinct_fleet.cli import main
from instinct_fleet.model.catalog import Catalog, CatalogError

from .test_knowledge import synthetic_wheel

RECIPE = """\
model = "meta-llama/Llama-3.1-8B-Instruct"
summary = "Llama 3.1 8B on one GPU, the chat tier"
port = 8100

[env]
VLLM_ROCM_USE_AITER = { value = "1", why = "AITER kernels" }

[args]
tensor-parallel-size = { value = 1, why = "one GPU" }
max-num-seqs = { value = 64, why = "chat concurrency" }
"""


def _project(tmp_path: Path, **recipes: str) -> Path:
    project = tmp_path / "infra"
    scaffold.init(project)
    (project / "inventories" / "t.py").write_text("gpu = ['gpu-1']\n")
    (project / "recipes").mkdir()
    for name, text in recipes.items():
        (project / "recipes" / f"{name}.toml").write_text(textwrap.dedent(text))
    return project


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_project_recipe_serves_like_a_shipped_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project = _project(tmp_path, chat=RECIPE)
    (project / "group_data" / "gpu.py").write_text('vllm_recipe = "chat"\n')
    code, out, err = _run(capsys, "plan", str(project / "inventories" / "t.py"), "--json")
    (svc,) = json.loads(out)["services"]
    assert code == 0, err
    assert svc["model"] == "meta-llama/Llama-3.1-8B-Instruct" and svc["port"] == 8100 and svc["env"]["VLLM_ROCM_USE_AITER"] == "1"
    assert svc["vllm_args"][svc["vllm_args"].index("--max-num-seqs") + 1] == "64"
    code, out, _ = _run(capsys, "recipes", "--project-dir", str(project), "--json")
    owners = {r["name"]: r["owner"] for r in json.loads(out)}
    assert code == 0 and owners["chat"] == "recipes/chat.toml" and owners["gpt-oss-120b"] == "instinct-fleet"
    code, out, _ = _run(capsys, "recipes", "--project-dir", str(project))
    assert "this project's recipes" in out and "chat" in out.split("this project's recipes")[1]


def test_a_project_recipe_is_validated_against_the_pinned_vllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project = _project(tmp_path, chat=RECIPE.replace("max-num-seqs", "max-num-seqz"))
    code, _, err = _run(capsys, "recipes", "--project-dir", str(project))
    assert code == 1 and "--max-num-seqz: vLLM 0.22.0 has no such flag" in err and "(recipe recipes/chat.toml) [flag-unknown]" in err
    (project / "group_data" / "gpu.py").write_text('vllm_recipe = "chat"\n')
    code, _, err = _run(capsys, "plan", str(project / "inventories" / "t.py"))
    assert code == 1 and "[flag-unknown]" in err


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("chat", RECIPE.replace('model = "meta-llama/Llama-3.1-8B-Instruct"\n', ""), "recipes/chat.toml: model: Field required"),
        ("chat", RECIPE.replace("port = 8100", 'port = "8100"'), "recipes/chat.toml: port: Input should be a valid integer"),
        ("chat", RECIPE + "[args.dtype]\nvalue = 'auto'\n", "recipes/chat.toml: args.dtype.why: Field required"),
        ("chat", RECIPE + "gpus = 2\n", "recipes/chat.toml: args.gpus: Input should be"),
        ("chat", RECIPE.replace("summary", "sumary"), "recipes/chat.toml: summary: Field required; sumary: Extra inputs"),
        ("chat", "model = \n", "recipes/chat.toml: not TOML: "),
        ("gpt-oss-120b", RECIPE, "recipes/gpt-oss-120b.toml: 'gpt-oss-120b' is the name of a shipped recipe"),
    ],
)
def test_a_broken_recipe_file_stops_every_command_naming_the_file(
    name: str, text: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = _project(tmp_path, **{name: text})
    for argv in (["plan", str(project / "inventories" / "t.py")], ["recipes", "--project-dir", str(project)]):
        code, _, err = _run(capsys, *argv)
        assert code == 2 and says in err and "Traceback" not in err, err


def test_vllm_facts_extracts_a_wheel_into_the_project_and_plan_uses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip downloads the release's wheel (here from a local index of one synthetic wheel: no network), the table lands
    in the project, and validation reads it, saying it is the project's and untested."""
    project = _project(tmp_path)
    index = tmp_path / "index"
    index.mkdir()
    synthetic_wheel(index)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.chdir(project)
    code, out, err = _run(capsys, "vllm-facts", "9.9.9")
    assert code == 0, err
    assert "wrote" in out and (project / "vllm-facts" / "vllm-9.9.9.json").is_file()
    assert Catalog.of(project).versions() == ["0.11.0", "0.22.0", "0.33.0", "9.9.9"]
    (project / "group_data" / "gpu.py").write_text("vllm_version = '9.9.9'\nvllm_recipe = None\nvllm_model = 'org/m'\n")
    code, out, err = _run(capsys, "plan", "inventories/t.py", "--json")
    doc = json.loads(out)
    assert "version-unsupported" not in {e["rule"] for e in doc["errors"]}, doc["errors"]
    assert doc["tables"] == {"9.9.9": "the project's vllm-facts/vllm-9.9.9.json (instinct-fleet vllm-facts; not tested by instinct-fleet)"}
    code, out, err = _run(capsys, "plan", "inventories/t.py")
    assert "vLLM 9.9.9: validated against the table the project's vllm-facts/vllm-9.9.9.json" in out
    # A version with no table names the command that makes one.
    other = {"vllm_version": "9.9.8", "vllm_recipe": None, "vllm_model": "org/m"}
    (project / "inventories" / "other.py").write_text(f"hosts = [('gpu-2', {other!r})]\n")
    code, _, err = _run(capsys, "plan", "inventories/other.py")
    assert code == 1 and "`instinct-fleet vllm-facts 9.9.8` extracts one" in err and "9.9.9" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["0.22.0"], "vLLM 0.22.0 is shipped with instinct-fleet and tested: nothing to extract"),
        (["9.9.8"], "pip could not download vllm==9.9.8"),
        (["9.9.8", "--wheel", "{wheel}"], "is vLLM 9.9.9, not 9.9.8"),
        (["9.9.9", "--wheel", "{junk}"], "is not a wheel (a zip file)"),
        (["9.9.9", "--wheel", "{nowheel}"], "is not a vLLM wheel: There is no item named 'vllm/envs.py' in the archive"),
        (["9.9.9", "--wheel", "{missing}"], "no such file"),
    ],
)
def test_vllm_facts_refuses_what_it_cannot_read(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    project = _project(tmp_path)
    wheel = synthetic_wheel(tmp_path)
    (tmp_path / "junk.whl").write_text("not a zip")
    import zipfile

    with zipfile.ZipFile(tmp_path / "vllm-9.9.9-empty.whl", "w") as zf:
        zf.writestr("other/file.py", "")
    names = {"wheel": wheel, "junk": tmp_path / "junk.whl", "nowheel": tmp_path / "vllm-9.9.9-empty.whl", "missing": tmp_path / "no.whl"}
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing to download from: pip says no at once
    code, _, err = _run(capsys, "vllm-facts", *[a.format(**names) for a in argv], "--project-dir", str(project))
    assert code == 2 and says in err and "Traceback" not in err, err
    assert not (project / "vllm-facts").exists()


def test_a_project_table_that_is_not_one_is_refused_with_its_file(tmp_path: Path) -> None:
    project = _project(tmp_path)
    facts = project / "vllm-facts"
    facts.mkdir()
    (facts / "vllm-9.9.9.json").write_text("{}")
    with pytest.raises(CatalogError, match=r"vllm-facts/vllm-9.9.9.json: not a table instinct-fleet vllm-facts wrote \(KeyError"):
        Catalog.of(project)
    (facts / "vllm-9.9.9.json").unlink()
    (facts / "vllm-0.22.0.json").write_text("{}")
    with pytest.raises(CatalogError, match=r"vLLM 0\.22\.0 is shipped with instinct-fleet and tested"):
        Catalog.of(project)


def test_vllm_facts_needs_a_project(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "vllm-facts", "9.9.9", "--wheel", str(synthetic_wheel(tmp_path)))
    assert code == 2 and "no project here to store the table in" in err


def test_a_project_table_must_be_the_version_its_name_says(tmp_path: Path) -> None:
    project = _project(tmp_path)
    (project / "vllm-facts").mkdir()
    data = json.loads(Path(__file__).resolve().parents[2].joinpath("instinct_fleet/model/knowledge/vllm-0.22.0.json").read_text())
    (project / "vllm-facts" / "vllm-9.9.9.json").write_text(json.dumps(data))  # 0.22.0's table under another name
    with pytest.raises(CatalogError, match=r"vllm-facts/vllm-9\.9\.9\.json: holds the table of vLLM 0\.22\.0, not 9\.9\.9"):
        Catalog.of(project)


def _site_with_vllm(tmp_path: Path) -> Path:
    """A python path holding the synthetic vLLM as an image holds it: the package's files and its distribution's metadata."""
    import zipfile

    site = tmp_path / "site"
    with zipfile.ZipFile(synthetic_wheel(tmp_path)) as zf:
        zf.extractall(site)
    for path in site.rglob("*.py"):  # as a reproducible image build leaves them: no date (mtime 0, before zip's 1980)
        os.utime(path, (0, 0))
    return site


def test_the_source_read_inside_an_image_gives_the_wheels_table(tmp_path: Path) -> None:
    """extract.IN_IMAGE, run by a real python3 over the package as an image holds it, hands the extractor what the wheel
    does: the same table, version included."""
    import subprocess
    import sys

    from instinct_fleet.model import extract

    site = _site_with_vllm(tmp_path)
    done = subprocess.run([sys.executable, "-c", extract.IN_IMAGE], capture_output=True, text=True, env={"PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    from_image = extract.extract_release(extract.from_image(done.stdout, tmp_path), "9.9.9")
    from_wheel = extract.extract_release(synthetic_wheel(tmp_path), "9.9.9")
    assert {k: v for k, v in from_image.items() if k != "source"} == {k: v for k, v in from_wheel.items() if k != "source"}
    empty = subprocess.run(
        [sys.executable, "-c", extract.IN_IMAGE], capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path / "none")}
    )
    assert empty.returncode != 0 and "no vllm package in this image's python3" in empty.stderr
    with pytest.raises(extract.ExtractError, match="cut off"):
        extract.from_image("version 9.9.9\nnot base64!", tmp_path)
    with pytest.raises(extract.ExtractError, match="did not list its vllm package"):
        extract.from_image("", tmp_path)


def test_vllm_facts_from_a_host_reads_its_image_with_docker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--from-host: the host's own vllm_image, read by docker on that host (here the command's python3 part runs here,
    as docker would run it in the image); the table lands in the inventory's project."""
    import shlex
    import subprocess
    import sys

    from instinct_fleet.live import remote
    from instinct_fleet.live.remote import Result

    project = _project(tmp_path)
    (project / "inventories" / "t.py").write_text("gpu = [('gpu-1', {'vllm_image': 'rocm/vllm-dev:nightly_main_20251110'})]\n")
    site = _site_with_vllm(tmp_path)
    commands: list[str] = []

    def run(self: object, name: str, command: str, timeout: int) -> Result:
        commands.append(command)
        argv = shlex.split(command)
        done = subprocess.run(
            [sys.executable, *argv[argv.index("python3") + 2 :]], capture_output=True, text=True, env={"PYTHONPATH": str(site)}
        )
        return Result(name, done.returncode == 0, done.stdout, done.stderr)

    monkeypatch.setattr(remote.Hosts, "run", run)
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "vllm-facts", "9.9.9", "--from-host", "gpu-1", "--inventory", str(project / "inventories" / "t.py"))
    assert code == 0, err
    assert commands[0].startswith("docker run --rm --network none --entrypoint python3 rocm/vllm-dev:nightly_main_20251110 -c ")
    assert (project / "vllm-facts" / "vllm-9.9.9.json").is_file() and "reading the vLLM source inside" in err
    code, _, err = _run(capsys, "vllm-facts", "9.9.8", "--from-host", "gpu-1", "--inventory", str(project / "inventories" / "t.py"))
    assert code == 2 and "is vLLM 9.9.9, not 9.9.8" in err

    def unreachable(self: object, name: str, command: str, timeout: int) -> Result:
        return Result(name, False, "", "", "cannot connect: Connection refused")

    monkeypatch.setattr(remote.Hosts, "run", unreachable)
    code, _, err = _run(capsys, "vllm-facts", "9.9.7", "--from-host", "gpu-1", "--inventory", str(project / "inventories" / "t.py"))
    assert code == 2 and "gpu-1 could not read rocm/vllm-dev:nightly_main_20251110: cannot connect: Connection refused" in err
    for argv, says in (
        (["--from-host", "gpu-1"], "give both"),
        (["--wheel", "x.whl", "--from-host", "gpu-1", "--inventory", "t.py"], "not both"),
        (["--from-host", "gpu-9", "--inventory", str(project / "inventories" / "t.py")], "matches no host name or group"),
    ):
        code, _, err = _run(capsys, "vllm-facts", "9.9.6", *argv)
        assert code == 2 and says in err and "Traceback" not in err, (argv, err)
