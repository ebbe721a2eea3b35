"""`gateway schema`: the JSON schema of routes.yaml, from the same pydantic models that validate it.

Editors that speak the YAML language server complete and check a routes file that starts with
`# yaml-language-server: $schema=<path or URL of this schema>` (the shipped routes files do).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from .common import SUBCOMMANDS

if TYPE_CHECKING:
    from ..core.settings import Settings

SCHEMA_ID = "https://lane-gateway.dev/schema/routes.json"


def routes_schema() -> dict[str, Any]:
    from ..core.config import RoutesConfig

    schema = RoutesConfig.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    schema["title"] = "routes.yaml (lane-gateway)"
    return schema


def render_schema() -> str:
    return json.dumps(routes_schema(), indent=2, sort_keys=True) + "\n"


def cmd_schema(args: argparse.Namespace) -> int:
    text = render_schema()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


def register(sub: argparse._SubParsersAction, settings: Settings) -> None:
    p = sub.add_parser("schema", help="print the JSON schema of routes.yaml (for editors and CI checks)")
    p.add_argument("-o", "--output", help="write it to this file instead of stdout")
    p.set_defaults(func=cmd_schema)


SUBCOMMANDS.append(register)
