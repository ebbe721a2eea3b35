"""What every `gateway` subcommand shares: exit codes, the one-line error, the parser, the registries
through which features add their subcommands and check steps (so that no feature imports main.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..core.settings import Settings

Command = Callable[[argparse.Namespace], int]

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class CliError(Exception):
    """A user error: printed as one line on stderr, the process exits with `code`."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage itself is one `--help` away)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def read_json_file(path: str, what: str = "request") -> object:
    """A JSON file given on the command line, or CliError naming the file and the line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {what} file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})") from None


def load_config(path: str):
    """routes.yaml, or CliError with the file, line and key the validation names."""
    from ..core.config import ConfigError, load_routes

    try:
        return load_routes(path)
    except ConfigError as exc:
        raise CliError(str(exc)) from None


# Subcommands and `gateway check` steps that live beside their features register here. A subcommand's
# options default to the environment's Settings (the parser's, also `args.settings`).
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction, Settings], None]] = []
CHECK_EXTRAS: list[Callable] = []
