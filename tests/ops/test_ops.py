"""The deployment files, checked offline: compose, Prometheus config, alert rules and their tests,
and the Grafana provisioning the dashboard depends on."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.compose_schema import PACKAGE, compose_schema

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "grafana" / "dashboards" / "repairproxy.json"
ALERTS = ROOT / "grafana" / "alerts.yaml"
ALERT_TESTS = Path(__file__).with_name("alerts_test.yaml")


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian package: apt-get install prometheus)")
    return path


def run(*args: str) -> str:
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def walk(node: Any) -> list[dict[str, Any]]:
    """Every JSON object in ``node``, depth first."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found.extend(walk(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(walk(value))
    return found


def test_compose_file_follows_the_compose_specification() -> None:
    schema = compose_schema()
    if schema is None:
        pytest.skip(f"the Compose schema ({PACKAGE}) is not cached and npm cannot fetch it")
    compose = load_yaml(ROOT / "docker/compose.yaml")
    validator = jsonschema.Draft201909Validator(schema)
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors
    services = compose["services"]
    assert set(services) == {"vllm", "proxy", "proxy-2", "redis", "lb", "prometheus", "grafana"}
    vllm = " ".join(services["vllm"]["command"])
    assert "--quantization=${QUANTIZATION:-awq}" in vllm and "AWQ" in vllm
    # The check has teeth: a misspelt key is refused.
    broken = {**compose, "services": {**services, "proxy": {**services["proxy"], "restrat": "no"}}}
    assert any(
        e.path and list(e.path)[:2] == ["services", "proxy"] for e in validator.iter_errors(broken)
    )


def test_prometheus_config_and_rules_check() -> None:
    out = run(tool("promtool"), "check", "config", "docker/prometheus.yml")
    assert "1 rule files found" in out
    out = run(tool("promtool"), "check", "rules", "grafana/alerts.yaml")
    assert f"{len(alert_rules())} rules found" in out


def test_alert_unit_tests_pass() -> None:
    assert "SUCCESS" in run(tool("promtool"), "test", "rules", str(ALERT_TESTS))


def test_every_alert_has_a_runbook_and_tests_firing_and_not() -> None:
    cases = [case for test in load_yaml(ALERT_TESTS)["tests"] for case in test["alert_rule_test"]]
    for rule in alert_rules():
        assert rule["annotations"].get("runbook"), rule["alert"]
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in mine), f"{rule['alert']} never fires in a test"
        assert any(not case["exp_alerts"] for case in mine), f"{rule['alert']} always fires"


def test_dashboard_uses_the_provisioned_datasource() -> None:
    provisioned = load_yaml(ROOT / "grafana/provisioning/datasources/prometheus.yaml")
    uids = {source["uid"] for source in provisioned["datasources"]}
    assert len(uids) == 1
    dashboard = json.loads(DASHBOARD.read_text())
    refs = [node["datasource"] for node in walk(dashboard) if "datasource" in node]
    assert len(refs) > 20
    assert all(ref == {"type": "prometheus", "uid": next(iter(uids))} for ref in refs), refs


def test_compose_mounts_what_the_provisioning_files_name() -> None:
    compose = load_yaml(ROOT / "docker/compose.yaml")
    grafana_mounts = compose["services"]["grafana"]["volumes"]
    provider = load_yaml(ROOT / "grafana/provisioning/dashboards/repairproxy.yaml")
    path = provider["providers"][0]["options"]["path"]
    assert f"../grafana/dashboards:{path}:ro" in grafana_mounts
    assert "../grafana/provisioning:/etc/grafana/provisioning:ro" in grafana_mounts
    prometheus = compose["services"]["prometheus"]
    config = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    mounted = {m.split(":")[1]: m.split(":")[0] for m in prometheus["volumes"]}
    in_container = Path(config.split("=", 1)[1])
    assert mounted[str(in_container)] == "./prometheus.yml"
    for rule_file in load_yaml(ROOT / "docker/prometheus.yml")["rule_files"]:
        target = (in_container.parent / rule_file).resolve()
        assert (ROOT / "docker" / mounted[str(target)]).resolve() == (
            ROOT / "docker" / rule_file
        ).resolve()


def test_dashboard_has_model_and_instance_variables() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names = [variable["name"] for variable in dashboard["templating"]["list"]]
    assert names == ["instance", "model"]
    for target in (node for node in walk(dashboard) if "expr" in node):
        expr = target["expr"]
        if "repairproxy_" in expr and "model" in expr:
            assert 'model=~"$model"' in expr, expr
        assert re.search(r'instance=~"\$instance"', expr), expr


def test_dockerfile_copies_what_the_package_build_reads() -> None:
    dockerfile = (ROOT / "docker/Dockerfile").read_text()
    copied = " ".join(line for line in dockerfile.splitlines() if line.startswith("COPY"))
    pyproject = (ROOT / "pyproject.toml").read_text()
    for name in ("pyproject.toml", "README.md", "repairproxy"):
        assert name in copied
    if "license-files" in pyproject:
        assert "LICENSE" in copied


def test_dashboard_panels_have_ids_queries_and_do_not_overlap() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["type"] == "row" or panel["targets"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine


def test_compose_proxy_environment_names_real_settings() -> None:
    from repairproxy.settings import Settings, settings_from_args

    environment = load_yaml(ROOT / "docker/compose.yaml")["services"]["proxy"]["environment"]
    names = {field.name for field in dataclasses.fields(Settings)}
    for key in environment:
        assert key.startswith("REPAIRPROXY_") and key[12:].lower() in names, key
    settings = settings_from_args([], {k: str(v) for k, v in environment.items()})
    assert settings.margin_probe and settings.metrics
