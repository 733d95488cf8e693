"""deploy/gke/*.yaml parse, hold the kinds docs/deploy/gke.md promises, and agree with the server and the image:
container args the real `jaxpaged serve` parser accepts after the image's entry point, the server's port, /health
probes on the pods that serve HTTP, TPU counts that match -tp, the Service and InferencePool selecting exactly those
pods, the image's non-root uid and cache volume, and vLLM metric names jaxpaged exports; and secure by default
(issue 56 #12): the API key from a Secret, a locked-down container, a NetworkPolicy for ports 8000 and 8476."""

import pathlib
import re

import pytest
import yaml

from jaxpaged.cli import build_parser
from jaxpaged.server.serve_flags import API_KEY_ENV
from jaxpaged.server.vllm import metrics as vllm_metrics
from tests.deploy.dockerfile import read_stages

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "gke"
RUNTIME = read_stages(ROOT / "docker" / "Dockerfile.tpu")[-1]
ENTRYPOINT = RUNTIME.last("ENTRYPOINT").exec_form()
SERVE_PORT = build_parser().parse_args(["serve"]).port
# What LeaderWorkerSet puts in each pod's environment, for Kubernetes' $(VAR) expansion of args.
LWS_ENV = {"LWS_LEADER_ADDRESS": "jaxpaged-multihost-0.jaxpaged-multihost", "LWS_GROUP_SIZE": "4",
           "LWS_WORKER_INDEX": "1"}


def load(name: str) -> dict:
    documents = list(yaml.safe_load_all((MANIFESTS / name).read_text()))
    assert len(documents) == 1, name
    return documents[0]


DEPLOYMENT, LWS = load("deployment.yaml"), load("leaderworkerset.yaml")
SERVICE, POOL = load("service.yaml"), load("inferencepool.yaml")
POLICY = load("networkpolicy.yaml")
LEADER = LWS["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
WORKER = LWS["spec"]["leaderWorkerTemplate"]["workerTemplate"]
SERVING_PODS = {"deployment": DEPLOYMENT["spec"]["template"], "lws-leader": LEADER}
ALL_PODS = {**SERVING_PODS, "lws-worker": WORKER}


def serve_args(pod: dict, environment: dict[str, str]):
    """The pod's single container's flags as `jaxpaged serve` parses them after the image's entry point."""
    (container,) = pod["spec"]["containers"]
    assert container["image"].endswith(":tpu")
    args = [re.sub(r"\$\((\w+)\)", lambda match: environment[match.group(1)], arg) for arg in container["args"]]
    try:
        return build_parser().parse_args([*ENTRYPOINT[1:], *args])
    except SystemExit:
        pytest.fail(f"`jaxpaged serve` rejects {args}")


def test_each_manifest_has_its_kind():
    assert (DEPLOYMENT["apiVersion"], DEPLOYMENT["kind"]) == ("apps/v1", "Deployment")
    assert (LWS["apiVersion"], LWS["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert (SERVICE["apiVersion"], SERVICE["kind"]) == ("v1", "Service")
    assert (POOL["apiVersion"], POOL["kind"]) == ("inference.networking.k8s.io/v1", "InferencePool")
    assert (POLICY["apiVersion"], POLICY["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert sorted(path.name for path in MANIFESTS.glob("*.yaml")) == [
        "deployment.yaml", "inferencepool.yaml", "leaderworkerset.yaml", "networkpolicy.yaml", "service.yaml"]


@pytest.mark.parametrize("pod", sorted(SERVING_PODS))
def test_serving_pods_expose_the_port_and_probe_health(pod):
    spec = SERVING_PODS[pod]["spec"]["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in spec["ports"]}
    assert ports["http"] == SERVE_PORT == serve_args(SERVING_PODS[pod], LWS_ENV).port
    for probe in ("startupProbe", "readinessProbe"):
        assert spec[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    assert SERVING_PODS[pod]["metadata"]["labels"] == {"app": "jaxpaged", "role": "server"}


def test_followers_serve_nothing_and_carry_no_probes():
    (container,) = WORKER["spec"]["containers"]
    assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports"} & set(container)
    assert WORKER["metadata"]["labels"]["role"] != "server"


@pytest.mark.parametrize("pod", sorted(ALL_PODS))
def test_pods_run_as_the_images_user_with_the_cache_volume(pod):
    spec = ALL_PODS[pod]["spec"]
    uid = int(RUNTIME.last("USER").arguments.split(":")[0])
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == uid
    (volume,) = RUNTIME.last("VOLUME").exec_form()
    mounts = [mount["mountPath"] for mount in spec["containers"][0]["volumeMounts"]]
    assert mounts == [volume, "/tmp"]  # /tmp: scratch space, the root filesystem being read-only
    assert all(set(each) == {"name", "emptyDir"} for each in spec["volumes"])


def test_deployment_uses_every_chip_of_its_host():
    spec = DEPLOYMENT["spec"]["template"]["spec"]
    chips = spec["containers"][0]["resources"]["limits"]["google.com/tpu"]
    assert serve_args(DEPLOYMENT["spec"]["template"], {}).tensor_parallel_size == chips
    rows, columns = map(int, spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"].split("x"))
    assert rows * columns == chips


def test_leader_worker_set_joins_one_process_per_host():
    template = LWS["spec"]["leaderWorkerTemplate"]
    size = template["size"]
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"  # a lost host restarts the whole group
    assert LEADER["spec"]["containers"][0]["args"] == WORKER["spec"]["containers"][0]["args"]
    for pod, index in ((LEADER, "0"), (WORKER, "3")):
        args = serve_args(pod, {**LWS_ENV, "LWS_GROUP_SIZE": str(size), "LWS_WORKER_INDEX": index})
        assert (args.num_processes, args.process_id) == (size, int(index))
        assert args.coordinator_address == f"{LWS_ENV['LWS_LEADER_ADDRESS']}:8476"
        chips_per_host = pod["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"]
        assert args.tensor_parallel_size == size * chips_per_host
        assert args.tensor_parallel_size % args.num_processes == 0  # each rank spans every host
        rows, columns = map(int, pod["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"].split("x"))
        assert rows * columns == args.tensor_parallel_size


def test_service_and_pool_select_exactly_the_serving_pods():
    selectors = [SERVICE["spec"]["selector"], POOL["spec"]["selector"]["matchLabels"]]
    for selector in selectors:
        for name, pod in ALL_PODS.items():
            labels = pod["metadata"]["labels"]
            assert (selector.items() <= labels.items()) == (name in SERVING_PODS), (selector, name)
    assert [(port["port"], port["targetPort"]) for port in SERVICE["spec"]["ports"]] == [(SERVE_PORT, "http")]
    assert POOL["spec"]["targetPorts"] == [{"number": SERVE_PORT}]


def test_the_gateway_metrics_named_in_the_docs_are_exported():
    exported = {vllm_metrics.PREFIX + name for _, name, _ in vllm_metrics._GAUGES}
    named = set(re.findall(r"vllm:\w+", (MANIFESTS / "inferencepool.yaml").read_text()))
    named |= set(re.findall(r"vllm:\w+", (ROOT / "docs" / "deploy" / "gke.md").read_text()))
    assert named >= {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}
    assert named <= exported, named - exported


@pytest.mark.parametrize("pod", sorted(ALL_PODS))
def test_containers_are_locked_down(pod):
    """Every container: non-root, no privilege escalation, every capability dropped, a read-only root filesystem
    (writes go to the emptyDir volumes)."""
    (container,) = ALL_PODS[pod]["spec"]["containers"]
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]} and context["readOnlyRootFilesystem"] is True
    assert "privileged" not in context or context["privileged"] is False


@pytest.mark.parametrize("pod", sorted(SERVING_PODS))
def test_serving_pods_take_the_api_key_from_a_secret(pod):
    """The server reads JAXPAGED_API_KEY; the serving pods set it from a Secret (required: no key, no start), and
    never as a literal or a flag."""
    (container,) = SERVING_PODS[pod]["spec"]["containers"]
    env = {entry["name"]: entry for entry in container["env"]}
    reference = env[API_KEY_ENV]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": "jaxpaged-api-key", "key": "key"}  # no `optional: true`
    assert "value" not in env[API_KEY_ENV]
    assert serve_args(SERVING_PODS[pod], LWS_ENV).api_key is None  # nothing on the command line
    assert "--metrics-open" not in container["args"]
    assert "jaxpaged-api-key" in (ROOT / "docs" / "deploy" / "gke.md").read_text()  # the docs create it


def _admitted_from(port: int) -> list[list[dict]]:
    """The `from` lists of the ingress rules that admit `port` (a rule without ports admits every port)."""
    rules = POLICY["spec"]["ingress"]
    return [rule["from"] for rule in rules if "ports" not in rule or any(p["port"] == port for p in rule["ports"])]


def test_network_policy_admits_8000_from_clients_and_8476_from_the_group_only():
    """The policy selects every jaxpaged pod; port 8000 is admitted only from labelled client pods (or the group's
    own pods), the coordinator's 8476 only from the pods of the same LeaderWorkerSet; no rule admits everyone."""
    assert POLICY["spec"]["podSelector"]["matchLabels"] == {"app": "jaxpaged"}
    assert POLICY["spec"]["policyTypes"] == ["Ingress"]
    for name, pod in ALL_PODS.items():
        assert {"app": "jaxpaged"}.items() <= pod["metadata"]["labels"].items(), name
    group = {"podSelector": {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": LWS["metadata"]["name"]}}}
    clients = {"podSelector": {"matchLabels": {"jaxpaged-client": "true"}}}
    assert _admitted_from(8476) == [[group]]
    assert sorted(map(str, _admitted_from(SERVE_PORT))) == sorted(map(str, [[clients], [group]]))
    assert all(rule.get("from") for rule in POLICY["spec"]["ingress"])  # an empty `from` would admit every pod
    coordinator = serve_args(LEADER, LWS_ENV).coordinator_address
    assert coordinator.endswith(":8476")
