"""The OpenTelemetry resource of a build's telemetry: what produced it, detected rather than typed.

One resource goes with the spans, the log records and the metrics of a session, so a backend
joins the three. Layers, each over the one before:

1. the service: ``service.name`` = ``trt-otel``, ``service.version``;
2. the SDK's own detectors, found by their entry-point names as
   ``OTEL_EXPERIMENTAL_RESOURCE_DETECTORS`` finds them: ``process``, ``os``, ``host``, and
   ``containerid`` (the contrib package that reads the cgroup files); a detector the installed
   SDK lacks is skipped;
3. Kubernetes, from the variables a pod's manifest sets through the downward API: each is the
   attribute's own name in upper snake case (``K8S_POD_NAME`` for ``k8s.pod.name``);
4. SLURM, from the variables ``slurmd`` sets in a job's environment (``SLURM_JOB_ID`` for
   ``slurm.job.id``, the array's job and task, the job's name, the cluster and the node);
5. the build's GPU, where one is sampled, as ``hw.*``;
6. what ``Resource.create()`` gives: ``service.instance.id``, the detectors named in
   ``OTEL_EXPERIMENTAL_RESOURCE_DETECTORS``, and ``OTEL_RESOURCE_ATTRIBUTES`` and
   ``OTEL_SERVICE_NAME`` on top of everything.

Everything read here comes from outside (the environment, /proc): values are bounded and checked
for what they are, and one that is not is left out. The process detector's command line is left
out whatever the SDK's version does (a ``--cancel-token`` is a secret).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource, ResourceDetector, get_aggregated_resources
from opentelemetry.semconv._incubating.attributes.hw_attributes import (
    HW_DRIVER_VERSION,
    HW_ID,
    HW_MODEL,
    HW_TYPE,
    HW_VENDOR,
    HwTypeValues,
)
from opentelemetry.semconv._incubating.attributes.k8s_attributes import (
    K8S_JOB_NAME,
    K8S_NAMESPACE_NAME,
    K8S_NODE_NAME,
    K8S_POD_NAME,
    K8S_POD_UID,
)
from opentelemetry.semconv._incubating.attributes.process_attributes import (
    PROCESS_COMMAND_ARGS,
    PROCESS_COMMAND_LINE,
)
from opentelemetry.semconv.attributes.container_attributes import CONTAINER_ID
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME, SERVICE_VERSION

from trt_otel.core.version import __version__

__all__ = [
    "DETECTORS",
    "KUBERNETES_ATTRIBUTES",
    "SLURM_ATTRIBUTES",
    "detect_resource",
    "environment_variable",
]

SERVICE = "trt-otel"

DETECTORS = ("process", "os", "host", "containerid")
"""The entry points (group ``opentelemetry_resource_detector``) asked, in order."""

KUBERNETES_ATTRIBUTES = (K8S_POD_NAME, K8S_POD_UID, K8S_NAMESPACE_NAME, K8S_NODE_NAME, K8S_JOB_NAME)

SLURM_ATTRIBUTES = (
    ("slurm.job.id", "SLURM_JOB_ID"),
    ("slurm.array.job.id", "SLURM_ARRAY_JOB_ID"),
    ("slurm.array.task.id", "SLURM_ARRAY_TASK_ID"),
    ("slurm.job.name", "SLURM_JOB_NAME"),
    ("slurm.cluster.name", "SLURM_CLUSTER_NAME"),
    ("slurm.node.name", "SLURMD_NODENAME"),
    ("slurm.job.restart_count", "SLURM_RESTART_COUNT"),  # set from the first requeue on
)
"""The SLURM job a build runs in: each attribute and the variable ``slurmd`` sets for it."""
_SLURM_NUMBER = re.compile(r"[0-9]{1,20}")
_SLURM_NAME = re.compile(r"[\x21-\x7e]([\x20-\x7e]{0,254}[\x21-\x7e])?")
"""Printable ASCII with no leading or trailing space, at most 256 characters."""

_SECRET_PRONE = frozenset({PROCESS_COMMAND_LINE, PROCESS_COMMAND_ARGS})
_KUBERNETES_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""A DNS subdomain (RFC 1123), what Kubernetes names pods, namespaces, nodes and jobs."""
_UID = re.compile(r"[0-9a-fA-F-]{8,64}")
_CONTAINER_ID = re.compile(r"[0-9a-f]{32,64}")
"""What container runtimes write in the cgroup paths (64 hex digits, some sandboxes 32); the
contrib detector's pattern also matches ``session-3.scope``'s ``3`` on a systemd host."""
_GPU_VENDOR = "NVIDIA"
_MAX_TEXT = 256

Warn = Callable[[str], None]

_LOG = logging.getLogger(__name__)


def environment_variable(attribute: str) -> str:
    """The variable a Kubernetes attribute is read from: its name in upper snake case."""
    return attribute.upper().replace(".", "_")


def detect_resource(
    build_attributes: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    warn: Warn | None = None,
    detectors: tuple[str, ...] = DETECTORS,
) -> Resource:
    """The session's resource (see the module's docstring); ``build_attributes`` are the
    build's (its ``gpu.*`` become ``hw.*``). ``environ`` is read for Kubernetes only: the SDK's
    own parts read the process's environment. Never raises for what it finds."""
    env = os.environ if environ is None else environ
    base = Resource({SERVICE_NAME: SERVICE, SERVICE_VERSION: __version__})
    detected = get_aggregated_resources(_detectors(detectors), base)
    attributes = {k: v for k, v in detected.attributes.items() if k not in _SECRET_PRONE}
    container = attributes.get(CONTAINER_ID)
    if container is not None and not _CONTAINER_ID.fullmatch(str(container)):
        del attributes[CONTAINER_ID]
    attributes.update(kubernetes_attributes(env, warn))
    attributes.update(slurm_attributes(env, warn))
    attributes.update(gpu_attributes(build_attributes or {}))
    specified = Resource.create()
    on_top = dict(specified.attributes)
    if str(on_top.get(SERVICE_NAME, "")).startswith("unknown_service"):
        del on_top[SERVICE_NAME]  # the SDK's placeholder, not a name anyone gave
    attributes.update(on_top)
    return _SessionResource(attributes, specified.schema_url)


class _SessionResource(Resource):
    """The SDK's resource, its hash taken once. The OTLP encoders group a batch by resource,
    hashing a span's (or a log record's) resource for each, and the SDK's hash is a JSON dump
    of every attribute, sorted: nearly 30% of the span export thread's instructions. A session's
    resource never changes once made; the hash is the SDK's own, so it equals the hash of any
    resource equal to it."""

    def __init__(self, attributes: Mapping[str, Any], schema_url: str | None = None) -> None:
        super().__init__(attributes, schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


def _detectors(names: tuple[str, ...]) -> list[ResourceDetector]:
    found: list[ResourceDetector] = []
    for name in names:
        for entry in importlib.metadata.entry_points(
            group="opentelemetry_resource_detector", name=name
        ):
            try:
                found.append(entry.load()())
            except Exception as error:  # a broken plug-in costs its attributes, no more
                _LOG.debug("resource detector %s did not load: %s", name, error)
            break
    return found


def kubernetes_attributes(environ: Mapping[str, str], warn: Warn | None = None) -> dict[str, str]:
    """``k8s.*`` from the downward API's variables; a value that is not a Kubernetes name (or
    uid) is left out, and said once."""
    found: dict[str, str] = {}
    for attribute in KUBERNETES_ATTRIBUTES:
        variable = environment_variable(attribute)
        value = environ.get(variable, "").strip()
        if not value:
            continue
        pattern = _UID if attribute == K8S_POD_UID else _KUBERNETES_NAME
        if len(value) <= 253 and pattern.fullmatch(value):
            found[attribute] = value
        elif warn is not None:
            warn(f"ignoring {variable}: {value[:64]!r} is not a Kubernetes name")
    return found


def slurm_attributes(environ: Mapping[str, str], warn: Warn | None = None) -> dict[str, str]:
    """``slurm.*`` from a SLURM job's variables: ids are numbers, names printable text; a value
    that is not is left out, and said once."""
    found: dict[str, str] = {}
    for attribute, variable in SLURM_ATTRIBUTES:
        value = environ.get(variable, "").strip()
        if not value:
            continue
        pattern = _SLURM_NAME if attribute.endswith(".name") else _SLURM_NUMBER
        if pattern.fullmatch(value):
            found[attribute] = value
        elif warn is not None:
            warn(f"ignoring {variable}: {value[:64]!r} is not what SLURM sets there")
    return found


def gpu_attributes(build_attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The build's GPU (its ``gpu.*`` build attributes, from NVML) as ``hw.*``; none when no GPU
    is sampled."""
    if "gpu.index" not in build_attributes:
        return {}
    uuid = build_attributes.get("gpu.uuid")
    identifier = uuid if isinstance(uuid, str) and uuid else f"gpu{build_attributes['gpu.index']}"
    attributes: dict[str, Any] = {
        HW_TYPE: HwTypeValues.GPU.value,
        HW_ID: str(identifier)[:_MAX_TEXT],
        HW_VENDOR: _GPU_VENDOR,
    }
    model = build_attributes.get("gpu.name")
    if model:
        attributes[HW_MODEL] = str(model)[:_MAX_TEXT]
    driver = build_attributes.get("gpu.driver")
    if driver:
        attributes[HW_DRIVER_VERSION] = str(driver)[:_MAX_TEXT]
    return attributes
