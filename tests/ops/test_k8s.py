"""The scale-out deployment files, checked offline: the Kubernetes manifests against Kubernetes'
own schemas (``kubernetes-validate``), and the compose stack's Redis, replicas and load balancer
agreeing with each other and with the proxy's settings."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from repairproxy.settings import Settings, settings_from_args

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "docker" / "k8s"
KUBERNETES_VERSION = "1.30.0"


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((path.name, doc))
    return found


def by_kind(kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in documents() if d["kind"] == kind and d["metadata"]["name"] == name)


def test_every_manifest_matches_the_kubernetes_schema() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kinds = []
    for name, doc in documents():
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']}: {exc.message} at {list(exc.path)}")
        kinds.append(doc["kind"])
    assert sorted(kinds) == sorted(
        ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "Service", "StatefulSet"]
    )


def test_the_schema_check_catches_a_mistake() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    broken = by_kind("Deployment", "repairproxy")
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pth"] = "/"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_configmap_names_real_settings_and_a_shared_store() -> None:
    data = by_kind("ConfigMap", "repairproxy")["data"]
    names = {spec.name for spec in dataclasses.fields(Settings)}
    for key in data:
        assert key.startswith("REPAIRPROXY_") and key[12:].lower() in names, key
    settings = settings_from_args([], data)  # --workers 2 is refused without Redis
    assert settings.episode_store.startswith("redis://") and settings.workers == 2


def test_deployment_probes_drain_and_service_agree() -> None:
    deployment = by_kind("Deployment", "repairproxy")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["envFrom"][0]["configMapRef"]["name"] == "repairproxy"
    drain = float(by_kind("ConfigMap", "repairproxy")["data"]["REPAIRPROXY_DRAIN_TIMEOUT"])
    pause = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > drain + pause
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = by_kind("Service", "repairproxy")
    assert service["spec"]["selector"].items() <= labels.items()
    port = container["ports"][0]
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    assert port["containerPort"] == 8080
    dockerfile = (ROOT / "docker/Dockerfile").read_text()
    assert '"--port", "8080"' in dockerfile
    assert '".[redis]"' in dockerfile  # the image can reach the store the manifests name


def test_redis_service_is_what_the_store_url_names() -> None:
    url = by_kind("ConfigMap", "repairproxy")["data"]["REPAIRPROXY_EPISODE_STORE"]
    host, port = re.match(r"redis://([^:/]+):(\d+)/", url).groups()  # type: ignore[union-attr]
    service = by_kind("Service", host)
    assert service["spec"]["ports"][0]["port"] == int(port)
    assert by_kind("StatefulSet", host)["spec"]["serviceName"] == host


def test_compose_replicas_share_redis_behind_nginx() -> None:
    compose = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    services = compose["services"]
    replicas = [name for name in services if name.startswith("proxy")]
    assert replicas == ["proxy", "proxy-2"]
    assert services["proxy"]["environment"] == services["proxy-2"]["environment"]
    store = services["proxy"]["environment"]["REPAIRPROXY_EPISODE_STORE"]
    assert store == "redis://redis:6379/0" and "redis" in services
    nginx = (ROOT / "docker/nginx.conf").read_text()
    servers = re.findall(r"^\s*server\s+([\w.-]+):(\d+)", nginx, re.M)
    assert servers == [(name, "8080") for name in replicas]
    assert "./nginx.conf:/etc/nginx/conf.d/default.conf:ro" in services["lb"]["volumes"]
    assert services["lb"]["ports"] == ["8080:8080"] and "listen 8080;" in nginx
    prometheus = yaml.safe_load((ROOT / "docker/prometheus.yml").read_text())
    targets = prometheus["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == [f"{name}:8080" for name in replicas]
