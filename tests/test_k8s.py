"""The Kubernetes manifests of ``deploy/k8s/``, checked offline: against Kubernetes' own schemas
(``kubernetes-validate``, whose schemas ship in the package), and for what the schemas cannot
see: the command each pod runs is one trt-otel accepts (the matrix's shell script is run by a
real shell), SIGTERM reaches trt-otel, the grace periods fit, and the manifests agree with each
other (ports, labels, the collector's address).

The PodMonitor is a custom resource of the Prometheus Operator, whose schema is not among
Kubernetes' own: it is checked against the part of the operator's ``monitoring.coreos.com/v1``
schema it uses, written out below, and for what it selects.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import jsonschema
import kubernetes_validate
import pytest
import yaml

from trt_otel.app.commands import build_parser
from trt_otel.core.durations import parse_duration

K8S = Path(__file__).resolve().parents[1] / "deploy" / "k8s"
VERSIONS = ("1.30", kubernetes_validate.latest_version())
"""The oldest Kubernetes the Jobs need (backoffLimitPerIndex, podFailurePolicy), and the
newest the package knows."""
DOWNWARD = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace",
            "NODE_NAME": "spec.nodeName"}  # fmt: skip
SPAN_FLUSH_S = 3.0


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]


def of_kind(name: str, kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in documents(name) if doc["kind"] == kind]
    return found


def build_container(job: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = job["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == "build"]
    return container


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of a container's command and arguments."""
    for name, value in env.items():
        text = text.replace(f"$({name})", value)
    return text


def option(argv: list[str], name: str) -> str:
    """The value of ``--name=value`` or ``--name value`` in ``argv``."""
    for index, item in enumerate(argv):
        if item.startswith(f"{name}="):
            return item.split("=", 1)[1]
        if item == name:
            return argv[index + 1]
    raise AssertionError(f"{name} is not given")


def check_command_line(argv: list[str]) -> argparse.Namespace:
    """``argv`` as trt-otel's own parser reads it (names, values, their types): a command line
    it would refuse fails the test with its message. (The files it names are the pod's.)"""
    parser = build_parser()

    def refuse(message: str) -> NoReturn:
        raise AssertionError(f"trt-otel {shlex.join(argv)}: {message}")

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.error = refuse
    parser.error = refuse  # type: ignore[method-assign]
    args: argparse.Namespace = parser.parse_args(argv)
    return args


MANIFESTS = sorted(path.name for path in K8S.glob("*.yaml"))


@pytest.mark.parametrize("name", MANIFESTS)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_for_kubernetes(name: str, version: str) -> None:
    checked = 0
    for document in documents(name):
        if document["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # not Kubernetes' own: test_the_podmonitor_...
        kubernetes_validate.validate(document, version, strict=True)
        checked += 1
    assert checked or name == "podmonitor.yaml"


def test_strict_validation_catches_a_misspelled_field() -> None:
    """The check above can fail: an unknown field is an error, not ignored."""
    job = of_kind("build-job.yaml", "Job")
    job["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 120
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, VERSIONS[-1], strict=True)


JOBS = [("build-job.yaml", "trt-build-resnet50"), ("matrix-job.yaml", "trt-build-matrix")]


@pytest.mark.parametrize(("name", "_job"), JOBS)
def test_each_build_pod_tells_its_spans_where_it_runs(name: str, _job: str) -> None:
    container = build_container(of_kind(name, "Job"))
    env = {item["name"]: item for item in container["env"]}
    for variable, field in DOWNWARD.items():
        assert env[variable]["valueFrom"]["fieldRef"]["fieldPath"] == field
    attributes = dict(
        pair.split("=", 1) for pair in env["OTEL_RESOURCE_ATTRIBUTES"]["value"].split(",")
    )
    assert attributes["k8s.pod.name"] == "$(POD_NAME)"
    assert attributes["k8s.namespace.name"] == "$(POD_NAMESPACE)"
    assert attributes["k8s.node.name"] == "$(NODE_NAME)"
    # Variables are expanded only from those defined before: the downward ones come first.
    names = [item["name"] for item in container["env"]]
    assert max(names.index(v) for v in DOWNWARD) < names.index("OTEL_RESOURCE_ATTRIBUTES")


def test_the_single_build_job_runs_a_build_trt_otel_accepts_and_sigterm_reaches_it() -> None:
    job = of_kind("build-job.yaml", "Job")
    pod = job["spec"]["template"]["spec"]
    container = build_container(job)
    # Exec form: trt-otel is the container's first process, and the kubelet's SIGTERM is its.
    assert container["command"] == ["trt-otel"]
    env = {"POD_NAME": "trt-build-resnet50-x7k2p", "NODE_NAME": "gpu-node-7"}
    argv = [expand(arg, env) for arg in container["args"]]
    check_command_line(argv)  # trt-otel's own parser
    assert option(argv, "--journal") == "/builds/journals/trt-build-resnet50-x7k2p.jsonl"
    check_pod_serves_metrics_and_outlives_its_grace(pod, container, argv)
    # The init step reads the model's volume and fetches nothing.
    (init,) = pod["initContainers"]
    script = " ".join(init["command"])
    assert not any(word in script for word in ("http", "curl", "wget", "git ", "pip "))
    assert all(mount.get("readOnly") for mount in init["volumeMounts"])
    model = argv[1]
    assert f"test -f {model}" in script


def check_pod_serves_metrics_and_outlives_its_grace(
    pod: dict[str, Any], container: dict[str, Any], argv: list[str]
) -> None:
    (port,) = [p for p in container["ports"] if p["name"] == "metrics"]
    assert int(option(argv, "--prometheus-port")) == port["containerPort"]
    assert option(argv, "--prometheus-address") == "0.0.0.0", "reachable from Prometheus"
    grace = parse_duration(option(argv, "--grace"))
    linger = parse_duration(option(argv, "--prometheus-linger"))
    assert pod["terminationGracePeriodSeconds"] > grace + linger + SPAN_FLUSH_S
    assert pod["restartPolicy"] == "Never", "a build is retried by the Job, not restarted"
    journal = Path(option(argv, "--journal"))
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert any(journal.is_relative_to(path) and not m.get("readOnly") for path, m in mounts.items())


def run_matrix_line(tmp_path: Path, index: int) -> subprocess.CompletedProcess[str]:
    """The matrix Job's script, run by a real shell for pod ``index``, with ``trt-otel`` on its
    PATH a program that writes down the command line it was given."""
    configmap = of_kind("matrix-job.yaml", "ConfigMap")
    matrix = tmp_path / "matrix"
    matrix.mkdir(exist_ok=True)
    (matrix / "builds.txt").write_text(configmap["data"]["builds.txt"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    recorder = bin_dir / "trt-otel"
    recorder.write_text(
        '#!/bin/sh\nprintf "%s\\n" "$$" > "$RECORD.pid"\n'
        'for a in "$@"; do printf "%s\\n" "$a"; done > "$RECORD"\n'
    )
    recorder.chmod(0o755)
    container = build_container(of_kind("matrix-job.yaml", "Job"))
    assert container["command"] == ["sh", "-c"]
    script = container["args"][0].replace("/matrix/", f"{matrix}/")
    record = tmp_path / f"argv-{index}"
    return subprocess.run(
        ["sh", "-c", f"echo $$ > {shlex.quote(str(record))}.shell; {script}"],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
             "JOB_COMPLETION_INDEX": str(index), "RECORD": str(record)},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


@pytest.mark.e2e
def test_each_matrix_pod_builds_its_line_as_trt_otel_itself(tmp_path: Path) -> None:
    job = of_kind("matrix-job.yaml", "Job")
    configmap = of_kind("matrix-job.yaml", "ConfigMap")
    lines = configmap["data"]["builds.txt"].splitlines()
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == len(lines), "one pod per line"
    engines = set()
    for index, line in enumerate(lines):
        done = run_matrix_line(tmp_path, index)
        assert done.returncode == 0, done.stderr
        record = tmp_path / f"argv-{index}"
        argv = record.read_text().splitlines()
        check_command_line(argv)  # trt-otel's own parser
        model, engine, *options = line.split()
        assert argv[:2] == ["build", f"/models/{model}"]
        assert option(argv, "--output") == f"/builds/engines/{engine}.engine"
        assert option(argv, "--journal") == f"/builds/journals/{engine}.jsonl"
        assert all(item in argv for item in options)
        # exec: trt-otel took the shell's process, so the kubelet's SIGTERM reaches it.
        shell_pid = (tmp_path / f"argv-{index}.shell").read_text().strip()
        assert (tmp_path / f"argv-{index}.pid").read_text().strip() == shell_pid
        engines.add(engine)
        pod = job["spec"]["template"]["spec"]
        check_pod_serves_metrics_and_outlives_its_grace(pod, build_container(job), argv)
    assert len(engines) == len(lines), "no two pods write the same engine or journal"


@pytest.mark.e2e
def test_a_matrix_index_without_a_line_is_a_usage_error(tmp_path: Path) -> None:
    lines = of_kind("matrix-job.yaml", "ConfigMap")["data"]["builds.txt"].splitlines()
    done = run_matrix_line(tmp_path, len(lines))
    assert done.returncode == 2
    assert f"no line {len(lines) + 1} in builds.txt" in done.stderr


def pod_failure_action(
    rules: list[dict[str, Any]], exit_code: int, conditions: tuple[str, ...] = ()
) -> str:
    """What a Job's ``podFailurePolicy`` does with a failed pod whose ``build`` container exited
    with ``exit_code`` and that has the (true) pod ``conditions``, as the Job controller decides:
    the rules in order, the first that matches deciding; none: ``Count`` (against the backoff
    limit)."""
    for rule in rules:
        codes = rule.get("onExitCodes")
        if codes is not None and codes.get("containerName", "build") == "build":
            listed = exit_code in codes["values"]
            if listed == (codes["operator"] == "In"):
                return str(rule["action"])
        for condition in rule.get("onPodConditions", []):
            if condition["type"] in conditions and condition.get("status", "True") == "True":
                return str(rule["action"])
    return "Count"


@pytest.mark.parametrize(
    ("name", "fail"), [("build-job.yaml", "FailJob"), ("matrix-job.yaml", "FailIndex")]
)
def test_each_exit_code_gets_the_retries_its_meaning_calls_for(name: str, fail: str) -> None:
    """The README's exit codes, as the Job reads them: a usage error or a decided cancel is not
    retried, a failed build is, and a pod a node drain or a preemption stopped is not counted,
    whatever it exited with (trt-otel exits 3 on the kubelet's SIGTERM, as on any cancel)."""
    rules = of_kind(name, "Job")["spec"]["podFailurePolicy"]["rules"]
    drained = ("DisruptionTarget",)
    assert pod_failure_action(rules, 2) == fail  # a bad model or option
    assert pod_failure_action(rules, 3) == fail  # --timeout, a stall, a person's cancel
    assert pod_failure_action(rules, 4) == "Count"  # a failed build: retried
    assert pod_failure_action(rules, 3, drained) == "Ignore"  # the node drained
    assert pod_failure_action(rules, 137, drained) == "Ignore"  # killed at the grace's end
    assert pod_failure_action(rules, 4, drained) == "Ignore"


@pytest.mark.parametrize("name", ["build-job.yaml", "matrix-job.yaml"])
def test_the_jobs_deadline_is_a_backstop_behind_each_builds_own_timeout(name: str) -> None:
    """``activeDeadlineSeconds`` bounds the Job's whole life, and stops its pods unrecorded
    where trt-otel's own ``--timeout`` ends a build with its reason: it must leave every
    attempt of every build its whole timeout and grace period."""
    job = of_kind(name, "Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    argv = [token for item in build_container(job)["args"] for token in shlex.split(item)]
    attempt_s = parse_duration(option(argv, "--timeout")) + pod["terminationGracePeriodSeconds"]
    if spec.get("completionMode") == "Indexed":
        waves = -(-spec["completions"] // spec["parallelism"])
        attempts = waves * (spec["backoffLimitPerIndex"] + 1)
    else:
        attempts = spec["backoffLimit"] + 1
    assert spec["activeDeadlineSeconds"] >= attempts * attempt_s


PODMONITOR_SCHEMA: dict[str, Any] = {
    # The part of the Prometheus Operator's PodMonitor (monitoring.coreos.com/v1) schema that
    # podmonitor.yaml uses; any other field is refused here, so a misspelling is caught.
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "podMetricsEndpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        }
                    },
                },
                "attachMetadata": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"node": {"type": "boolean"}},
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": "^(0|([0-9]+(ms|s|m|h))+)$"},
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "sourceLabels": {
                                            "type": "array",
                                            "items": {
                                                "type": "string",
                                                "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$",
                                            },
                                        },
                                        "targetLabel": {"type": "string"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_the_podmonitor_scrapes_every_build_pod_on_its_metrics_port() -> None:
    monitor = of_kind("podmonitor.yaml", "PodMonitor")
    jsonschema.validate(monitor, PODMONITOR_SCHEMA)
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    for name, _ in JOBS:
        job = of_kind(name, "Job")
        labels = job["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"{name}'s pods are selected"
        ports = {p["name"] for p in build_container(job)["ports"]}
        assert endpoint["port"] in ports
    targets = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert {"host", "gpu"} <= targets, "the labels the fleet dashboard groups by"


def test_the_podmonitor_schema_refuses_a_misspelled_field() -> None:
    monitor = of_kind("podmonitor.yaml", "PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, PODMONITOR_SCHEMA)


def test_the_collector_receives_what_the_builds_send_and_uses_what_it_defines() -> None:
    configmap = of_kind("otel-collector.yaml", "ConfigMap")
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    service = config["service"]
    for pipeline in service["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"{kind[:-1]} {component} is defined"
    assert set(service["extensions"]) <= set(config["extensions"])
    assert "traces" in service["pipelines"]
    # The builds' OTLP endpoint is this collector's Service, on its gRPC receiver's port.
    svc = of_kind("otel-collector.yaml", "Service")
    grpc_port = int(config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].rsplit(":")[-1])
    assert grpc_port in {p["port"] for p in svc["spec"]["ports"]}
    expected = f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{grpc_port}"
    for name, _ in JOBS:
        env = {e["name"]: e.get("value") for e in build_container(of_kind(name, "Job"))["env"]}
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == expected
    # And its Deployment mounts the configuration it is given.
    deployment = of_kind("otel-collector.yaml", "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["--config=/conf/config.yaml"]
    volume = deployment["spec"]["template"]["spec"]["volumes"][0]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert json.dumps(config)  # plain data, nothing YAML-only
