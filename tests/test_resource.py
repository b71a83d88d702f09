"""The resource of a build's telemetry is detected (the SDK's detectors, the container, the pod,
the GPU), with ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` on top: read back from the
wire by a real OTLP receiver, from a real ``trt-otel demo`` process."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
from opentelemetry.semconv._incubating.attributes.hw_attributes import (
    HW_ID,
    HW_MODEL,
    HW_TYPE,
    HW_VENDOR,
)
from opentelemetry.semconv._incubating.attributes.k8s_attributes import (
    K8S_JOB_NAME,
    K8S_NAMESPACE_NAME,
    K8S_NODE_NAME,
    K8S_POD_NAME,
)

from cli import CLI
from otlp_receiver import OtlpReceiver
from trt_otel.views.resource import (
    detect_resource,
    gpu_attributes,
    kubernetes_attributes,
    slurm_attributes,
)

POD = {
    "K8S_POD_NAME": "build-resnet-7f9c4",
    "K8S_NAMESPACE_NAME": "ml-builds",
    "K8S_NODE_NAME": "gpu-node-3",
    "K8S_JOB_NAME": "build-resnet",
}


def container_id_here() -> str | None:
    """The container's id as its cgroup paths say, read independently of any detector."""
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    found = re.search(r"/([0-9a-f]{32,64})(?:\.scope)?$", text, re.MULTILINE)
    return found.group(1) if found else None


@pytest.mark.e2e
def test_a_builds_resource_is_detected_with_the_environment_on_top(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    secret = "s3cret-token-never-exported"
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "K8S_"))},
        **POD,
        # On top of everything: a name given, and an attribute that wins over a detected one.
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=ci,k8s.node.name=from-otel",
    }
    process = subprocess.run(
        [*CLI, "demo", "--no-progress", "--speed", "0", "--cancel-token", secret,
         "--otlp-endpoint", f"http://127.0.0.1:{receiver.http_port}"],
        capture_output=True, text=True, timeout=120, env=environment, check=False,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr
    spans = receiver.wait_for(2)
    resources = {tuple(sorted(s.resource.items())) for s in spans}
    assert len(resources) == 1, "one resource for every span"
    attributes = dict(next(iter(resources)))

    assert attributes["service.name"] == "trt-otel"
    assert attributes["service.version"]
    assert re.fullmatch(r"[0-9a-f-]{36}", attributes["service.instance.id"])
    assert attributes["telemetry.sdk.language"] == "python"
    # The SDK's process, OS and host detectors, of the process that exported.
    assert attributes["process.runtime.name"] == "cpython"
    assert isinstance(attributes["process.pid"], int) and attributes["process.pid"] > 1
    assert attributes["os.type"] == "linux"
    assert attributes["host.name"] == socket.gethostname()
    # The container, where its cgroup paths name one.
    assert attributes.get("container.id") == container_id_here()
    # The pod, from the downward API's variables; OTEL_RESOURCE_ATTRIBUTES on top.
    assert attributes[K8S_POD_NAME] == POD["K8S_POD_NAME"]
    assert attributes[K8S_NAMESPACE_NAME] == POD["K8S_NAMESPACE_NAME"]
    assert attributes[K8S_JOB_NAME] == POD["K8S_JOB_NAME"]
    assert attributes[K8S_NODE_NAME] == "from-otel"
    assert attributes["deployment.environment.name"] == "ci"
    # A command line's secrets stay home.
    assert not any(secret in str(value) for value in attributes.values())
    assert "process.command_args" not in attributes

    renamed = subprocess.run(
        [*CLI, "demo", "--no-progress", "--speed", "0",
         "--otlp-endpoint", f"http://127.0.0.1:{receiver.http_port}"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**environment, "OTEL_SERVICE_NAME": "model-builds"},
    )  # fmt: skip
    assert renamed.returncode == 0, renamed.stderr
    names = {s.resource["service.name"] for s in receiver.wait_for(len(spans) + 2)}
    assert names == {"trt-otel", "model-builds"}


def test_kubernetes_values_that_are_not_names_are_left_out_and_said() -> None:
    warnings: list[str] = []
    found = kubernetes_attributes(
        {
            "K8S_POD_NAME": "ok-pod-1",
            "K8S_NAMESPACE_NAME": "evil\x1b[2J",
            "K8S_NODE_NAME": "x" * 300,
            "K8S_JOB_NAME": "",
        },
        warnings.append,
    )
    assert found == {K8S_POD_NAME: "ok-pod-1"}
    assert len(warnings) == 2 and all("is not a Kubernetes name" in w for w in warnings)
    assert "\x1b" not in "".join(warnings)


def test_a_kubernetes_name_as_long_as_a_dns_subdomain_may_be_is_kept() -> None:
    longest = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
    assert len(longest) == 253
    warnings: list[str] = []
    assert kubernetes_attributes({"K8S_NODE_NAME": longest}, warnings.append) == {
        K8S_NODE_NAME: longest
    }
    assert warnings == []


SLURM_JOB = {
    "SLURM_JOB_ID": "4242",
    "SLURM_ARRAY_JOB_ID": "4240",
    "SLURM_ARRAY_TASK_ID": "2",
    "SLURM_JOB_NAME": "engines resnet50",
    "SLURM_CLUSTER_NAME": "gpu-east",
    "SLURMD_NODENAME": "node-07",
    "SLURM_RESTART_COUNT": "1",
}


def test_a_slurm_job_is_in_the_resource() -> None:
    resource = detect_resource(environ=SLURM_JOB, detectors=())
    assert {k: v for k, v in resource.attributes.items() if k.startswith("slurm.")} == {
        "slurm.job.id": "4242",
        "slurm.array.job.id": "4240",
        "slurm.array.task.id": "2",
        "slurm.job.name": "engines resnet50",
        "slurm.cluster.name": "gpu-east",
        "slurm.node.name": "node-07",
        "slurm.job.restart_count": "1",
    }


def test_slurm_values_that_are_not_what_slurm_sets_are_left_out_and_said() -> None:
    warnings: list[str] = []
    found = slurm_attributes(
        {
            "SLURM_JOB_ID": "42; rm -rf /",
            "SLURM_ARRAY_TASK_ID": "7",
            "SLURM_JOB_NAME": "evil\x1b[2J",
            "SLURMD_NODENAME": "n" * 300,
        },
        warnings.append,
    )
    assert found == {"slurm.array.task.id": "7"}
    assert len(warnings) == 3 and all("is not what SLURM sets there" in w for w in warnings)
    assert "\x1b" not in "".join(warnings)


def test_a_sampled_gpu_is_hardware_of_type_gpu() -> None:
    # What NvmlReader.describe() gives for a GPU (no GPU on the test machine: its fields here).
    described = {
        "gpu.index": 0,
        "gpu.name": "NVIDIA H200",
        "gpu.uuid": "GPU-5f1e2d3c-0000-1111-2222-333344445555",
        "gpu.driver": "570.86.15",
        "gpu.memory_total_bytes": 150 * 2**30,
    }
    hardware = gpu_attributes(described)
    assert hardware[HW_TYPE] == "gpu"
    assert hardware[HW_ID] == described["gpu.uuid"]
    assert hardware[HW_MODEL] == "NVIDIA H200"
    assert hardware[HW_VENDOR] == "NVIDIA"
    assert gpu_attributes({"model.path": "m.onnx"}) == {}, "no GPU sampled, no hw.*"
    resource = detect_resource(described, environ={})
    assert resource.attributes[HW_ID] == described["gpu.uuid"]
    assert K8S_POD_NAME not in resource.attributes


def test_the_session_resource_is_one_key_with_the_sdk_s_own_resource() -> None:
    """The OTLP encoders group a batch's spans by resource (a dict keyed by it): the session's
    resource, whose hash is taken once, hashes and compares as the SDK's resource of the same
    attributes does, and a batch of spans under it encodes as one resource."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext

    resource = detect_resource(environ=POD)
    same = Resource(dict(resource.attributes), resource.schema_url)
    assert resource == same and hash(resource) == hash(same)
    assert len({resource: None, same: None}) == 1
    other = Resource({**resource.attributes, K8S_POD_NAME: "another-pod"}, resource.schema_url)
    assert hash(resource) != hash(other)

    spans = [
        ReadableSpan(
            name=name,
            context=SpanContext(1, index + 1, is_remote=False),
            resource=resource if index % 2 else same,
        )
        for index, name in enumerate(("a", "b", "c", "d"))
    ]
    encoded = encode_spans(spans)
    assert len(encoded.resource_spans) == 1
    assert len(encoded.resource_spans[0].scope_spans[0].spans) == 4
