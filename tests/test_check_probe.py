"""`gateway check --probe` asks each replica's GET /v1/models (a real emulator here) and flags what
disagrees with the lane, naming routes.yaml's line and key; the revisions it hears feed qualification."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.cli.main import main
from tests.support.emulator_proc import run_emulator
from tests.support.routes import lane, routes


@pytest.fixture(scope="module")
def emu():
    with run_emulator(flavour="vllm", model="served-model", max_model_len=32768, model_root="org/served-model") as e:
        yield e


def check(capsys, tmp_path: Path, **lane_over) -> tuple[int, str, str, list[str]]:
    probed = lane(lane_over.pop("url"), **{"upstream_model": "served-model", "limits": {"max_context_tokens": 32768},
                                           **lane_over})
    path = tmp_path / "routes.yaml"
    path.write_text(yaml.safe_dump(routes({"a": probed}, {"m": "a"}), sort_keys=False))
    code = main(["check", str(path), "--probe"])
    out, err = capsys.readouterr()
    return code, out, err, path.read_text().splitlines()


def test_a_lane_that_matches_its_replica_passes(capsys, tmp_path, emu) -> None:
    code, out, err, _ = check(capsys, tmp_path, url=emu.url)
    assert code == 0, err
    assert "serves served-model (max_model_len 32768, root org/served-model)" in out


@pytest.mark.parametrize("over,key,needle", [
    ({"upstream_model": "other-model"}, "upstream_model", "does not serve 'other-model' (it serves: served-model)"),
    ({"limits": {"max_context_tokens": 65536}}, "limits.max_context_tokens", "max_model_len 32768"),
    ({"engine": "sglang"}, "engine", "is vllm, the lane says engine: sglang"),
    ({"revision": "org/older-model"}, "revision", "reports 'org/served-model'"),
])
def test_each_mismatch_is_named_with_its_line_and_key(capsys, tmp_path, emu, over, key, needle) -> None:
    code, _, err, lines = check(capsys, tmp_path, url=emu.url, **over)
    assert code == 1, err
    (line,) = [x for x in err.splitlines() if needle in x]
    lineno = int(line.split("routes.yaml:")[1].split(":")[0])
    assert f"lanes.a.{key}: " in line
    assert lines[lineno - 1].strip().startswith(key.split(".")[-1] + ":"), (line, lines[lineno - 1])


def test_the_probed_revision_decides_qualification(capsys, tmp_path, emu) -> None:
    """A lane qualified with another model root is refused once the replica says what it serves."""
    from gateway.core.config import load_routes
    from gateway.qualify.identity import lane_identity
    from gateway.qualify.records import DirStore

    code, *_ = check(capsys, tmp_path, url=emu.url, qualification="required")
    assert code == 1  # no record at all
    lane = load_routes(tmp_path / "routes.yaml").lanes["a"]
    identity = lane_identity(lane, "org/previous-model")
    DirStore(tmp_path / "qualifications").save({"lane": "a", "passed": True, "at_unix": 1.0, "by": "t",
                                                "identity": identity.fields, "identity_hash": identity.hash,
                                                "config_hash": identity.config_hash})
    assert main(["check", str(tmp_path / "routes.yaml")]) == 0  # offline: the revision is not known
    capsys.readouterr()
    assert main(["check", str(tmp_path / "routes.yaml"), "--probe"]) == 1
    err = capsys.readouterr().err
    assert "the upstream revision changed" in err and "org/served-model" in err
