"""The docs' generated pages match the code, and the routes files shipped validate against the schema
that `gateway schema` publishes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jsonschema_rs
import pytest
import yaml

from gateway.cli.schema import render_schema, routes_schema

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ["routes.yaml", "routes.compose.yaml"]


def test_the_generated_reference_pages_are_up_to_date() -> None:
    run = subprocess.run([sys.executable, "scripts/gen_docs.py", "--check"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_routes_files_validate_and_name_the_schema(name: str) -> None:
    text = (REPO / name).read_text(encoding="utf-8")
    assert text.splitlines()[0] == "# yaml-language-server: $schema=docs/reference/routes.schema.json"
    errors = [e.message for e in jsonschema_rs.validator_for(routes_schema()).iter_errors(yaml.safe_load(text))]
    assert errors == []


def test_the_schema_refuses_what_the_gateway_refuses() -> None:
    validator = jsonschema_rs.validator_for(routes_schema())
    good = yaml.safe_load((REPO / "routes.yaml").read_text(encoding="utf-8"))
    assert not validator.is_valid({**good, "unknown_key": 1})
    assert not validator.is_valid({"models": {"a": "b"}})  # no lanes


def test_gateway_schema_prints_the_published_schema(tmp_path: Path) -> None:
    out = tmp_path / "schema.json"
    run = subprocess.run([sys.executable, "-m", "gateway.cli", "schema", "-o", str(out)], cwd=REPO,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    committed = (REPO / "docs/reference/routes.schema.json").read_text()
    assert out.read_text(encoding="utf-8") == render_schema() == committed


def test_the_readme_is_a_short_front_page_whose_links_resolve() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    for target in __import__("re").findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / target).is_file(), target
