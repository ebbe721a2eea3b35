"""Every `gateway` subcommand answers a user's mistake with one line on stderr and the documented exit
code (README, "Command line"): 2 for usage and input (missing file, bad JSON or YAML, invalid routes,
unknown lane), 3 for a URL or port that cannot be reached, 1 for a check that found a problem."""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path

import pytest

from gateway.cli.main import main
from tests.support.emulator_proc import free_port

REPO = Path(__file__).resolve().parents[1]
DOWN = f"http://127.0.0.1:{free_port()}"  # nothing listens there


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    routes = (REPO / "routes.yaml").read_text(encoding="utf-8")
    paths = {
        "routes": routes,
        "bad_yaml": "lanes:\n  a: {engine: vllm\n  b: 1\n",
        "bad_key": routes.replace("    effort_policy: pin\n", "    effort_policy: pin\n    colour: blue\n", 1),
        "dangling": routes.replace("glm-4.6: glm-openai", "glm-4.6: no-such-lane"),
        "refused": routes.replace("max_images: 4\n", "max_images: 5\n", 1),
        "down": routes.replace("http://127.0.0.1:8101", DOWN),
        "no_key_file": routes.replace("  conversation_header: X-Conversation-Id\n",
                                      "  conversation_header: X-Conversation-Id\n"
                                      "  client_keys: {hashed_file: k.sha256}\n"),
        "request": json.dumps({"messages": [{"role": "user", "content": "Hi"}]}),
        "bad_json": '{"messages": [\n',
        "not_object": "[1, 2]",
    }
    out = {}
    for name, text in paths.items():
        suffix = ".json" if name in ("request", "bad_json", "not_object") else ".yaml"
        path = tmp_path / (name + suffix)
        path.write_text(text, encoding="utf-8")
        out[name] = str(path)
    out["missing"] = str(tmp_path / "missing.yaml")
    out["qualifications"] = str(REPO / "qualifications")
    return out


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own exit
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@contextlib.contextmanager
def port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


CASES = [
    # (id, argv with {placeholders}, exit code, text the one line must hold)
    ("serve-missing-routes", ["serve", "--routes", "{missing}"], 2, "cannot read"),
    ("serve-bad-yaml", ["serve", "--routes", "{bad_yaml}"], 2, "not valid YAML"),
    ("serve-unknown-key", ["serve", "--routes", "{bad_key}"], 2, "unknown key"),
    ("serve-no-workers", ["serve", "--routes", "{routes}", "--workers", "0"], 2, "--workers"),
    ("serve-bad-redis-url", ["serve", "--routes", "{routes}", "--redis", "localhost:6379"], 2, "redis://"),
    ("serve-bad-log-level", ["serve", "--log-level", "loud"], 2, "invalid choice"),
    ("serve-port-in-use", ["serve", "--routes", "{routes}", "--port", "{busy}"], 3, "cannot listen"),
    ("serve-bad-option", ["serve", "--colour"], 2, "unrecognized arguments"),
    ("serve-missing-key-file", ["serve", "--routes", "{no_key_file}"], 2, "k.sha256"),
    ("demo-missing-routes", ["demo", "--routes", "{missing}"], 2, "cannot read"),
    ("demo-bad-yaml", ["demo", "--routes", "{bad_yaml}"], 2, "not valid YAML"),
    ("check-missing", ["check", "{missing}"], 2, "cannot read"),
    ("check-bad-yaml", ["check", "{bad_yaml}"], 2, "not valid YAML"),
    ("check-unknown-lane", ["check", "{dangling}"], 2, "no-such-lane"),
    ("check-unknown-key", ["check", "{bad_key}"], 2, "lanes.dsv41-vllm.colour: unknown key"),
    ("check-missing-key-file", ["check", "{no_key_file}"], 2, "gateway.client_keys.hashed_file"),
    ("check-bad-redis-url", ["check", "{routes}", "--redis", "localhost:6379"], 2, "redis://"),
    ("check-redis-unreachable", ["check", "{routes}", "--redis", f"redis://127.0.0.1:{free_port()}/0"], 3,
     "does not answer"),
    ("check-refused-lane", ["check", "{refused}", "--records", "{qualifications}"], 1, "lanes.dsv41-vllm.limits"),
    ("check-probe-unreachable", ["check", "{down}", "--probe", "--timeout", "2"], 3, "did not answer"),
    ("emulate-bad-option", ["emulate", "--flavour", "tgi"], 2, "invalid choice"),
    ("emulate-bad-json", ["emulate", "--config-json", "{{nope"], 2, "not valid JSON"),
    ("emulate-port-in-use", ["emulate", "--port", "{busy}"], 3, "cannot listen"),
    ("render-missing-request", ["render", "{missing}", "--lane", "dsv41-vllm", "--routes", "{routes}"], 2,
     "cannot read"),
    ("render-bad-json", ["render", "{bad_json}", "--lane", "dsv41-vllm", "--routes", "{routes}"], 2, "not valid JSON"),
    ("render-not-a-request", ["render", "{not_object}", "--lane", "dsv41-vllm", "--routes", "{routes}"], 2,
     "JSON object"),
    ("render-missing-routes", ["render", "{request}", "--lane", "dsv41-vllm", "--routes", "{missing}"], 2,
     "cannot read"),
    ("render-bad-yaml", ["render", "{request}", "--lane", "dsv41-vllm", "--routes", "{bad_yaml}"], 2, "not valid YAML"),
    ("render-unknown-lane", ["render", "{request}", "--lane", "nope", "--routes", "{routes}"], 2, "no lane 'nope'"),
    ("render-no-lane-option", ["render", "{request}"], 2, "--lane"),
    ("stats-missing-data", ["stats", "--data-dir", "{missing}"], 2, "no records file"),
    ("stats-bad-window", ["stats", "--window", "soon"], 2, "--window"),
    ("stats-unreachable", ["stats", "--url", DOWN], 3, DOWN),
    ("drift-unreachable", ["drift", "--url", DOWN], 3, DOWN),
    ("qualify-missing-routes", ["qualify", "dsv41-vllm", "--routes", "{missing}"], 2, "cannot read"),
    ("qualify-bad-yaml", ["qualify", "dsv41-vllm", "--routes", "{bad_yaml}"], 2, "not valid YAML"),
    ("qualify-unknown-lane", ["qualify", "nope", "--routes", "{routes}"], 2, "no lane 'nope'"),
    ("qualify-unreachable-replica", ["qualify", "dsv41-vllm", "--routes", "{down}", "--no-save"], 3,
     "no replica answers"),
    ("qualify-unreachable-gateway", ["qualify", "dsv41-vllm", "--gateway", DOWN], 3, "cannot reach"),
    ("qualify-status-bad-yaml", ["qualify", "--status", "--routes", "{bad_yaml}"], 2, "not valid YAML"),
    ("no-subcommand", [], 2, "required"),
    ("unknown-subcommand", ["serv"], 2, "invalid choice"),
]


@pytest.mark.parametrize("argv,code,needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_user_error_is_one_line_and_its_exit_code(capsys, files, argv, code, needle) -> None:
    with port_in_use() as busy:
        args = [a.format(busy=busy, **files) for a in argv]
        got, out, err = run(capsys, *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert got == code, (got, out, err)
    assert "Traceback" not in err
    if argv[:1] == ["check"] and (code == 1 or "--probe" in argv):  # a report; one line per problem on stderr
        assert lines and all(line.count(": ") >= 2 for line in lines) and any(needle in line for line in lines), err
        assert all(".yaml:" in line for line in lines), err  # file:line of every problem
        return
    assert len(lines) == 1, err
    assert lines[0].startswith("gateway"), lines[0]
    assert needle in lines[0], lines[0]


def test_config_errors_name_the_file_line_and_key(capsys, files) -> None:
    code, _, err = run(capsys, "check", files["bad_key"])
    assert code == 2
    line = err.strip()
    text = Path(files["bad_key"]).read_text().splitlines()
    lineno = int(line.split(files["bad_key"] + ":")[1].split(":")[0])
    assert text[lineno - 1].strip() == "colour: blue", (line, text[lineno - 1])
