"""docker-compose.yml as written, without a Docker engine: its shape, `docker-compose config`, and every
service's command, arguments and environment (the image's ENV under the file's `environment:`) run on
loopback, each waited for by its own healthcheck: two gateways on one Redis, one conversation whose
turns alternate between them and hit the emulator's prefix cache from the second turn on.

Only addresses are translated: a service name becomes 127.0.0.1, each service's port a free port, the
file's mounts and volumes folders of the test, the image's `gateway`/`python` this venv's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.core.config import load_routes
from gateway.emulator.cli import config_from_args
from gateway.emulator.config import EmulatorConfig
from tests.support.chat import Conversation
from tests.support.emulator_proc import free_port
from tests.support.services import Service, run_service
from tests.support.poll import wait_until

REPO = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))
SERVICES: dict[str, dict] = COMPOSE["services"]
GATEWAYS = [name for name, s in SERVICES.items() if s["command"][:2] == ["gateway", "serve"]]
EMULATORS = [name for name, s in SERVICES.items() if s["command"][:2] == ["gateway", "emulate"]]


def dockerfile_stages() -> list[str]:
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text(encoding="utf-8"))
    return re.split(r"(?m)^FROM ", text)[1:]


def image_env() -> dict[str, str]:
    """ENV of the Dockerfile's last stage (what every container of the image starts with)."""
    env: dict[str, str] = {}
    for line in dockerfile_stages()[-1].splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def image_healthcheck() -> list[str]:
    (line,) = [x for x in dockerfile_stages()[-1].splitlines() if x.startswith("HEALTHCHECK ")]
    return json.loads(line.split(" CMD ", 1)[1])


# -- the image and the file's shape ----------------------------------------------------------------------


def test_the_image_is_multi_stage_non_root_and_installs_the_wheel_only() -> None:
    build, final = dockerfile_stages()[0], dockerfile_stages()[-1]
    assert len(dockerfile_stages()) >= 2 and " AS build" in build.splitlines()[0]
    assert "pip wheel" in build
    assert "COPY gateway" not in final and "COPY . " not in final  # no source tree in the image
    assert re.search(r"pip install [^\n]*--no-index --find-links /wheels lane-gateway", final)
    (user,) = re.findall(r"(?m)^USER (\S+)", final)
    assert user not in ("root", "0")
    assert image_healthcheck() and image_env()["GATEWAY_DATA_DIR"] == "/data"



def test_only_the_gateways_are_published_and_only_on_loopback() -> None:
    for name, svc in SERVICES.items():
        if name in GATEWAYS:
            assert all(str(p).startswith("127.0.0.1:") for p in svc["ports"]), (name, svc["ports"])
        else:
            assert "ports" not in svc, f"{name} is published on the host; it is for the compose network only"
    assert len(GATEWAYS) == 2 and "redis" in SERVICES


def test_every_service_has_a_healthcheck_and_gateways_wait_for_healthy_dependencies() -> None:
    for name, svc in SERVICES.items():
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name in GATEWAYS:
        deps = SERVICES[name]["depends_on"]
        assert set(deps) == {"redis", *EMULATORS}
        assert all(d["condition"] == "service_healthy" for d in deps.values()), deps


def test_each_gateway_has_its_own_data_volume() -> None:
    data = {}
    for name in GATEWAYS:
        env = {**image_env(), **SERVICES[name].get("environment", {})}
        (vol,) = [v.split(":")[0] for v in SERVICES[name]["volumes"] if v.split(":")[1] == env["GATEWAY_DATA_DIR"]]
        assert vol in COMPOSE["volumes"], f"{name}'s data directory is not a named volume"
        data[name] = vol
    assert len(set(data.values())) == len(data), data


def test_each_emulator_is_started_like_its_demo_lane() -> None:
    demo = load_routes(REPO / "routes.yaml")
    compose_routes = load_routes(REPO / "routes.compose.yaml")
    for name, lane in compose_routes.lanes.items():
        (host,) = {r.split("//")[1].split(":")[0] for r in lane.replicas}
        service = SERVICES[host]
        started, _, port = config_from_args(service["command"][2:])
        wanted = demo.lanes[name].emulator
        assert wanted is not None, f"routes.yaml's {name} is not an emulated demo lane"
        expected = EmulatorConfig().merged({"flavour": wanted.flavour, "model": lane.upstream_model, **wanted.knobs})
        assert started == expected, f"{host} is not started like routes.yaml's lane {name}"
        assert lane.upstream_model == demo.lanes[name].upstream_model and lane.render == demo.lanes[name].render
        assert str(port) in service["expose"] and all(r.endswith(f":{port}") for r in lane.replicas)


def test_docker_compose_validates_the_file() -> None:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (.ci/run installs Debian's)")
    out = subprocess.run([exe, "-f", str(REPO / "docker-compose.yml"), "config", "-q"], capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr


# -- every service, as the file states, on loopback -----------------------------------------------------------


class Loopback:
    """Translates the compose network to this machine: names, ports, mounts and executables."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {(name, int(p)): free_port() for name, s in SERVICES.items() for p in s.get("expose", [])}
        self.ports.update({("redis", 6379): free_port()})
        self.mounts: dict[str, dict[str, str]] = {}
        for name, svc in SERVICES.items():
            self.mounts[name] = {}
            for spec in svc.get("volumes", []):
                src, dst = spec.split(":")[:2]
                if src.startswith("./"):  # a file of the checkout, with its addresses translated
                    local = root / name / Path(src).name
                    local.parent.mkdir(parents=True, exist_ok=True)
                    local.write_text(self.addresses((REPO / src).read_text(encoding="utf-8"), name), encoding="utf-8")
                else:  # a named volume: a folder of its own
                    local = root / "volumes" / src
                    local.mkdir(parents=True, exist_ok=True)
                self.mounts[name][dst] = str(local)

    def addresses(self, text: str, service: str) -> str:
        for (name, port), local in self.ports.items():
            text = re.sub(rf"(?<![\w.-]){re.escape(name)}:{port}\b", f"127.0.0.1:{local}", text)
            if name == service:
                text = re.sub(rf"\b(127\.0\.0\.1|localhost):{port}\b", f"127.0.0.1:{local}", text)
        return text.replace("0.0.0.0", "127.0.0.1")

    def value(self, text: str, service: str) -> str:
        text = self.addresses(text, service)
        for dst in sorted(self.mounts[service], key=len, reverse=True):
            if text == dst or text.startswith(dst + "/"):
                return self.mounts[service][dst] + text[len(dst):]
        return text

    def argv(self, args: list, service: str) -> list[str]:
        out = [self.value(str(a), service) for a in args]
        own = {str(p): str(local) for (name, p), local in self.ports.items() if name == service}
        for i in range(1, len(out)):
            if out[i - 1] in ("--port", "-p") and out[i] in own:
                out[i] = own[out[i]]
        exe = {"gateway": str(Path(sys.executable).parent / "gateway"), "python": sys.executable,
               "redis-server": shutil.which("redis-server"), "redis-cli": shutil.which("redis-cli")}
        out[0] = exe.get(out[0]) or out[0]
        if service == "redis":  # the container's default port, on loopback
            if Path(out[0]).name == "redis-server":
                out += ["--port", str(self.ports[("redis", 6379)]), "--bind", "127.0.0.1"]
        return out

    def env(self, service: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        stated = {**image_env(), **{k: str(v) for k, v in SERVICES[service].get("environment", {}).items()}}
        env = {**base, **{k: self.value(v, service) for k, v in stated.items()}}
        if env.get("GATEWAY_PORT") in {str(p) for (n, p) in self.ports if n == service}:
            env["GATEWAY_PORT"] = str(self.ports[(service, int(env["GATEWAY_PORT"]))])
        return env

    def url(self, service: str) -> str:
        (port,) = [local for (name, _), local in self.ports.items() if name == service]
        return f"http://127.0.0.1:{port}"


def _start_order() -> list[str]:
    order: list[str] = []
    while len(order) < len(SERVICES):
        for name, svc in SERVICES.items():
            if name not in order and all(d in order for d in svc.get("depends_on", {})):
                order.append(name)
    return order


def _wait_healthy(net: Loopback, svc: Service, timeout: float = 60.0) -> None:
    test = SERVICES[svc.name]["healthcheck"]["test"]
    argv = net.argv(test[1:], svc.name) if test[0] == "CMD" else ["sh", "-c", net.value(test[1], svc.name)]

    def healthy() -> bool:
        if svc.proc.poll() is not None:
            raise AssertionError(f"{svc.name} exited with {svc.proc.returncode}:\n{svc.log()[-3000:]}")
        return subprocess.run(argv, capture_output=True, env=net.env(svc.name), timeout=10).returncode == 0

    wait_until(healthy, timeout, f"{svc.name} healthy by its own healthcheck", interval=0.2,
               detail=lambda: svc.log()[-3000:])


@pytest.mark.packaging  # five processes with tokenizers: ~30-60 s on a loaded 2-core machine
def test_the_compose_services_serve_one_conversation_across_both_gateways(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    net = Loopback(tmp_path)
    running: dict[str, Service] = {}
    with contextlib.ExitStack() as stack:
        for name in _start_order():
            workdir = tmp_path / "workdir" / name  # the image's WORKDIR: empty
            workdir.mkdir(parents=True)
            svc = stack.enter_context(run_service(name, net.argv(SERVICES[name]["command"], name), env=net.env(name),
                                                  cwd=workdir, log_dir=tmp_path))
            svc.url = net.url(name)
            running[name] = svc
        for name in _start_order():  # as compose does: a service starts once its dependencies are healthy
            _wait_healthy(net, running[name])

        for name in GATEWAYS:  # the image's own HEALTHCHECK answers for each gateway too
            argv = net.argv(image_healthcheck(), name)
            assert subprocess.run(argv, env=net.env(name), capture_output=True, timeout=10).returncode == 0

        chat = Conversation("deepseek-v4-flash")
        verdicts = [chat.turn(running[GATEWAYS[i % 2]]) for i in range(4)]
        assert verdicts[0]["verdict"] == "cold"
        assert [v["verdict"] for v in verdicts[1:]] == ["hit"] * 3, verdicts
        assert all(v["render_matches_engine"] for v in verdicts), verdicts
        assert all(v["reported_cached_tokens"] >= v["predicted_cached_tokens"] > 0 for v in verdicts[1:]), verdicts
        stats = httpx.get(running["emulator-vllm"].url + "/emulator/stats").json()
        assert stats["requests"] >= 4, stats
        for name in GATEWAYS:  # each process writes its own records file, in its own volume
            data_dir = Path(net.env(name)["GATEWAY_DATA_DIR"])
            assert (data_dir / "records.sqlite3").exists(), f"{name}: nothing in {data_dir}"
