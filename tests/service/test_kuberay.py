"""deploy/kuberay/memex.yaml serves as written (issue 47: the example's fronts were not Ray
nodes, bound 127.0.0.1, and had no Service or readiness probe). No Kubernetes here: the
RayCluster is checked against KubeRay's own CRD schema (kuberay/ray.io_rayclusters.yaml.gz,
vendored from ray-project/kuberay at feeaf72fa, v1.7.0-rc.0+5, Apache-2.0; sha256 of the
YAML c44704442eef0c6721ad40c1d66782c8bd3fdab9d3344306a5820910a679baa1), serve.toml against
MemEx's own reader, and the parts against each other: what one names, the other has."""

from __future__ import annotations

import copy
import gzip
import hashlib
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from memex.service._config import parse_config
from memex.service._routes import router

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deploy" / "kuberay" / "memex.yaml"
CRD = Path(__file__).parent / "kuberay" / "ray.io_rayclusters.yaml.gz"
CRD_SHA256 = "c44704442eef0c6721ad40c1d66782c8bd3fdab9d3344306a5820910a679baa1"


def _docs() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    return {d["kind"]: d for d in docs}


def _schema() -> dict[str, Any]:
    raw = gzip.decompress(CRD.read_bytes())
    assert hashlib.sha256(raw).hexdigest() == CRD_SHA256  # the vendored file, unchanged
    crd = yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = v1["schema"]["openAPIV3Schema"]
    return schema


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return _schema()


def _errors(schema: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    v = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]


def _groups(cluster: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = cluster["spec"]
    return {"head": spec["headGroupSpec"],
            **{g["groupName"]: g for g in spec["workerGroupSpecs"]}}


def test_the_raycluster_is_valid_under_kuberays_schema(schema: dict[str, Any]) -> None:
    cluster = _docs()["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    assert _errors(schema, cluster) == []
    # the controls: the schema is read and checks what matters here
    for path, value in ((("spec", "workerGroupSpecs", 0, "replicas"), "three"),
                        (("spec", "headGroupSpec", "rayStartParams", "num-cpus"), 0),
                        (("spec", "workerGroupSpecs", 1, "template", "spec", "containers", 0,
                          "ports", 0, "containerPort"), "8000")):
        bad = copy.deepcopy(cluster)
        at: Any = bad
        for step in path[:-1]:
            at = at[step]
        at[path[-1]] = value
        assert _errors(schema, bad), path
    bad = copy.deepcopy(cluster)
    del bad["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["name"]
    assert _errors(schema, bad)
    # head loss: the GCS's state in Redis, its password from a Secret (the control: a
    # backend KubeRay does not know is refused)
    ft = cluster["spec"]["gcsFaultToleranceOptions"]
    assert ft["redisAddress"] and ft["redisPassword"]["valueFrom"]["secretKeyRef"]["key"]
    bad = copy.deepcopy(cluster)
    bad["spec"]["gcsFaultToleranceOptions"]["backend"] = "etcd"
    assert _errors(schema, bad)


def test_serve_toml_is_read_by_memex_and_reaches_the_head() -> None:
    docs = _docs()
    text = docs["Secret"]["stringData"]["serve.toml"]
    config = parse_config(tomllib.loads(text))
    assert config.host == "0.0.0.0"  # reachable from the Service, not the pod's loopback
    assert config.cluster is not None
    name = docs["RayCluster"]["metadata"]["name"]
    host, port = config.cluster.address.rsplit(":", 1)
    assert host == f"{name}-head-svc"  # the head's Service, as KubeRay names it
    head = _groups(docs["RayCluster"])["head"]["template"]["spec"]["containers"][0]
    assert int(port) in {p["containerPort"] for p in head["ports"]}
    assert config.cluster.storage.startswith("s3://")


def test_every_pod_is_a_ray_node_and_the_fronts_serve_behind_the_service() -> None:
    docs = _docs()
    cluster, service = docs["RayCluster"], docs["Service"]
    config = parse_config(tomllib.loads(docs["Secret"]["stringData"]["serve.toml"]))
    assert cluster["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    groups = _groups(cluster)
    assert set(groups) == {"head", "slabs", "fronts"}
    for name, group in groups.items():
        pod = group["template"]["spec"]
        (c,) = pod["containers"]
        assert "$KUBERAY_GEN_RAY_START_CMD" in c["args"][0] or \
            "${KUBERAY_GEN_RAY_START_CMD/--block/}" in c["args"][0], name  # a Ray node
        shm = {m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"}
        assert any(v["name"] in shm and v.get("emptyDir", {}).get("medium") == "Memory"
                   for v in pod["volumes"]), name  # the object store's memory
        assert {"secretRef": {"name": "memex-storage"}} in c["envFrom"], name
    fronts = groups["fronts"]
    assert fronts["rayStartParams"]["num-cpus"] == "0"  # no slab lands on a front
    pod = fronts["template"]["spec"]
    (c,) = pod["containers"]
    (port,) = c["ports"]
    assert port["containerPort"] == config.port
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    secret = next(v for v in pod["volumes"] if v["name"] == "config")["secret"]
    assert secret["secretName"] == docs["Secret"]["metadata"]["name"]
    assert c["args"][0].endswith(f"exec memex serve --config {mount['mountPath']}/serve.toml")
    routes = {r.path for r in router.routes}  # type: ignore[attr-defined]
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert c[probe]["httpGet"] == {"path": path, "port": port["name"]}
        assert path in routes
    assert service["spec"]["selector"] == {"ray.io/cluster": cluster["metadata"]["name"],
                                           "ray.io/group": "fronts"}
    (sport,) = service["spec"]["ports"]
    assert sport["targetPort"] == port["name"]


def test_the_fronts_command_starts_the_node_then_serves(tmp_path: Path) -> None:
    """The fronts' shell line run by bash: KubeRay's ``ray start ... --block`` runs without
    --block (else memex serve never started), then memex serve takes the process over."""
    c = _groups(_docs()["RayCluster"])["fronts"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["/bin/bash", "-c", "--"]
    (tmp_path / "memex").write_text('#!/bin/sh\necho "memex $*"\n')
    (tmp_path / "memex").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
           "KUBERAY_GEN_RAY_START_CMD": "echo ray start --address=memex-head-svc:6379 "
                                        "--num-cpus=0 --block"}
    out = subprocess.run([*c["command"], *c["args"]], env=env, capture_output=True,
                         text=True, timeout=30, check=True).stdout.splitlines()
    assert out == ["ray start --address=memex-head-svc:6379 --num-cpus=0",
                   "memex serve --config /etc/memex/serve.toml"]
