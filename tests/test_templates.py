"""Chat templates: packaged (importlib.resources) or a lane's own file relative to routes.yaml; a missing
one refuses the config with file, line and key, never a silent generic render."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from gateway.core.config import ConfigError, load_routes
from gateway.qualify.identity import lane_identity
from gateway.render.renderer import Renderer
from gateway.render.result import RenderOptions
from gateway.render.template import TemplateNotFound, load_template, packaged_templates, resolve_template, template_path

PACKAGED = template_path("deepseek_v4.1")


def write_routes(folder: Path, template: str | None) -> Path:
    routes = {"lanes": {"a": {"replicas": ["http://127.0.0.1:9"], "upstream_model": "m",
                              "render": {"template": template}}}, "models": {"m": "a"}}
    path = folder / "routes.yaml"
    path.write_text(yaml.safe_dump(routes, sort_keys=False), encoding="utf-8")
    return path


def test_the_packaged_template_is_read_from_the_package() -> None:
    assert "deepseek_v4.1" in packaged_templates()
    assert PACKAGED.is_file() and PACKAGED.parent.name == "chat_templates" and PACKAGED.parent.parent.name == "gateway"
    assert resolve_template("deepseek_v4.1") == "deepseek_v4.1"
    assert load_template("deepseek_v4.1").source == PACKAGED.read_text(encoding="utf-8")


def test_a_lane_names_its_own_file_relative_to_routes_yaml(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "mine.jinja").write_text(PACKAGED.read_text(encoding="utf-8"), encoding="utf-8")
    routes = write_routes(tmp_path, "t/mine.jinja")
    monkeypatch.chdir("/")  # relative to routes.yaml, not to the working directory
    config = load_routes(routes)
    assert config.lanes["a"].render.template == str(tmp_path / "t" / "mine.jinja")


@pytest.mark.parametrize("template,needle", [("nope", "no packaged chat template 'nope' (packaged: deepseek_v4.1"),
                                             ("./missing.jinja", "missing.jinja' not found")])
def test_a_missing_template_refuses_the_file_with_its_line(tmp_path: Path, template: str, needle: str) -> None:
    routes = write_routes(tmp_path, template)
    with pytest.raises(ConfigError) as err:
        load_routes(routes)
    line = routes.read_text().splitlines().index(f"      template: {template}") + 1
    assert f"{routes}:{line}: lanes.a.render.template: " in str(err.value) and needle in str(err.value)


def test_a_missing_tokenizer_file_refuses_the_file(tmp_path: Path) -> None:
    routes = write_routes(tmp_path, "deepseek_v4.1")
    routes.write_text(routes.read_text().replace("template: deepseek_v4.1", "template: deepseek_v4.1\n"
                                                 "      tokenizer_path: tok/tokenizer.json"))
    with pytest.raises(ConfigError, match=r"lanes\.a\.render\.tokenizer_path: no tokenizer file at .*tok/tokenizer"):
        load_routes(routes)


def test_an_edited_template_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("one", encoding="utf-8")
    assert load_template(str(path)).source == "one"
    path.write_text("two!", encoding="utf-8")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert load_template(str(path)).source == "two!"
    path.unlink()
    with pytest.raises(TemplateNotFound):
        load_template(str(path))


def test_an_edited_template_file_renders_its_new_text_not_cached_items(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text(PACKAGED.read_text(encoding="utf-8"), encoding="utf-8")
    renderer = Renderer()
    options = RenderOptions(template=str(path))
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "ls", "description": "List files.",
                                                         "parameters": {"type": "object", "properties": {}}}}]}
    assert "## Tools" in renderer.render(body, options).prompt
    path.write_text(PACKAGED.read_text(encoding="utf-8").replace("## Tools", "## Toolbox"), encoding="utf-8")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert "## Toolbox" in renderer.render(body, options).prompt


def test_an_own_template_counts_in_the_identity_by_content_not_place(tmp_path: Path) -> None:
    ids = []
    for folder, text in (("x", "A"), ("y", "A"), ("z", "B")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mine.jinja").write_text(text, encoding="utf-8")
        ids.append(lane_identity(load_routes(write_routes(tmp_path / folder, "mine.jinja")).lanes["a"]).config_hash)
    assert ids[0] == ids[1] != ids[2]


@pytest.mark.parametrize("command", ["check", "serve"])
def test_a_template_that_does_not_compile_is_one_line_from_check_and_serve(tmp_path: Path, capsys, command) -> None:
    from gateway.cli.main import main

    (tmp_path / "bad.jinja").write_text("{% for m in messages %}{{ m.content }", encoding="utf-8")
    routes = write_routes(tmp_path, "bad.jinja")
    argv = ["check", str(routes)] if command == "check" else ["serve", "--routes", str(routes), "--port", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "lanes.a.render.template: the template does not compile" in err, err
    assert f"{routes}:" in err and "bad.jinja line 1" in err
