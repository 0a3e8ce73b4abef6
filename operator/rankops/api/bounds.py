"""Bounds on tenant input: what a spec may say so that it can be stored, deleted and served.

A RankingModel's author is a tenant. Every name or reference here ends up in a URL or in a child
object, every map in a pod's annotations, every tensor in a request Triton must hold: each is
checked twice from one definition, as a pydantic rule (the operator and `rankops render`) and as
a schema pattern or CEL rule (the API server, at apply), so a bad value is refused with the field
named instead of being accepted and failing later in a child the tenant cannot see.
"""
from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any

from pydantic import AfterValidator, Field

# Object names: a DNS subdomain (RFC 1123), as Secrets, ConfigMaps and GpuNodePools are named.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_SUBDOMAIN_MAX = 253
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# A SharedServer's name, as a RankingModel's: its children add suffixes (-shared, -triton-api-key).
SERVER_NAME_MAX = 40
CONFIG_MAP_KEY = r"^[-._a-zA-Z0-9]+$"
# A Gateway: name, or namespace/name.
PARENT_REF = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

# Image references (the grammar of distribution/reference, which the kubelet resolves): an
# image with a space or an upper-case path is accepted by a Deployment and never pulls.
_PATH_COMPONENT = r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"({_DOMAIN_COMPONENT}(\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(:[0-9]+)?"
IMAGE_REFERENCE = (rf"^({_DOMAIN}/)?{_PATH_COMPONENT}(/{_PATH_COMPONENT})*(:[\w][\w.-]{{0,127}})?"
                   r"(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")
IMAGE_REFERENCE_MAX = 512
URI_MAX = 2048

# Annotation keys are qualified names: an optional DNS-subdomain prefix and '/', then a name of
# at most 63 characters.
# No backslashes: the same text is a CEL string literal.
ANNOTATION_KEY = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# Kubernetes caps all annotations of one object at 256 KiB; a gate pod carries two of these maps
# (gateJobs' and its gate's) plus the operator's own, so each map stays well inside a quarter.
ANNOTATIONS_MAX_CHARS = 64 * 1024
ANNOTATIONS_MAX_KEYS = 64

# What one batched request may carry per tensor: gRPC and Triton's HTTP front end refuse
# messages over 2 GiB, so a spec implying more can never be served.
TENSOR_MAX_BYTES = 2 * 1024 ** 3
# Bytes per element; STRING counts its 4-byte length prefix, the least such an element takes.
ELEMENT_BYTES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "INT16": 2, "INT32": 4, "INT64": 8, "FP16": 2,
                 "FP32": 4, "FP64": 8, "BF16": 2, "STRING": 4}

# Per replica, request = limit: more than any GPU host has means a pod that is Pending forever.
CPU_MAX_CORES = 1024
MEMORY_MAX = "16Ti"
_SUFFIX = {"": 1, "m": Decimal("0.001"), "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12,
           "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}


def quantity(text: str) -> Decimal:
    """The value of a Kubernetes quantity in the forms the Resources patterns allow."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?", text)
    if not match:
        raise ValueError(f"{text!r} is not a quantity")
    return Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""]


def _cpu_in_range(value: str) -> str:
    if not 0 < quantity(value) <= CPU_MAX_CORES:
        raise ValueError(f"cpu {value!r} must be more than 0 and at most {CPU_MAX_CORES} cores "
                         "(request = limit per replica)")
    return value


def _memory_in_range(value: str) -> str:
    if not 0 < quantity(value) <= quantity(MEMORY_MAX):
        raise ValueError(f"memory {value!r} must be more than 0 and at most {MEMORY_MAX} per replica: "
                         "no node could hold more, the pod would stay Pending")
    return value


CPU_RULES = [{"rule": f"quantity(self).isGreaterThan(quantity('0')) && "
                      f"quantity(self).compareTo(quantity('{CPU_MAX_CORES}')) <= 0",
              "message": f"cpu must be more than 0 and at most {CPU_MAX_CORES} cores"}]
MEMORY_RULES = [{"rule": f"quantity(self).isGreaterThan(quantity('0')) && "
                         f"quantity(self).compareTo(quantity('{MEMORY_MAX}')) <= 0",
                 "message": f"memory must be more than 0 and at most {MEMORY_MAX} per replica"}]
CPU_CHECK = AfterValidator(_cpu_in_range)
MEMORY_CHECK = AfterValidator(_memory_in_range)


def cpu_quantity(description: str) -> Any:
    """The type of a CPU quantity field ("500m", "2"): its pattern and range, checked both sides."""
    return Annotated[str, CPU_CHECK, Field(
        pattern=r"^[0-9]+(\.[0-9]+)?m?$", max_length=32,
        json_schema_extra={"x-kubernetes-validations": CPU_RULES}, description=description)]


def memory_quantity(description: str) -> Any:
    """The type of a memory quantity field ("512Mi", "8Gi"): its pattern and range, checked both sides."""
    return Annotated[str, MEMORY_CHECK, Field(
        pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$", max_length=32,
        json_schema_extra={"x-kubernetes-validations": MEMORY_RULES}, description=description)]

# Disk a Triton pod may fill on its node (the model volume, /tmp): requested, limited and the
# emptyDirs' sizeLimit, so a download that grows past it is stopped and the pod evicted instead of
# the node's disk filling. The bounds keep a spec from asking for more than any node has.
MODEL_VOLUME_MIN, MODEL_VOLUME_MAX = "64Mi", "2Ti"
TMP_MIN, TMP_MAX = "64Mi", "256Gi"


def storage_check(field: str, low: str, high: str) -> Any:
    """A quantity within [low, high], named as `field` when refused."""
    def in_range(value: str) -> str:
        if not quantity(low) <= quantity(value) <= quantity(high):
            raise ValueError(f"{field} {value!r} must be at least {low} and at most {high}")
        return value
    return AfterValidator(in_range)


def storage_rules(field: str, low: str, high: str) -> list[dict[str, str]]:
    return [{"rule": f"quantity(self).compareTo(quantity('{low}')) >= 0 && "
                     f"quantity(self).compareTo(quantity('{high}')) <= 0",
             "message": f"{field} must be at least {low} and at most {high}"}]


# Label selectors of a tenant's NetworkPolicy peers (matchLabels only): qualified-name keys,
# label values, a few entries.
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
SELECTOR_MAX_LABELS = 16


def _labels_fit(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is None:
        return value
    if len(value) > SELECTOR_MAX_LABELS:
        raise ValueError(f"at most {SELECTOR_MAX_LABELS} labels")
    for key, item in value.items():
        if len(key) > 317 or not re.match(ANNOTATION_KEY, key):
            raise ValueError(f"label key {key!r} is not a qualified name (prefix/name)")
        if not re.match(LABEL_VALUE, item):
            raise ValueError(f"label {key}={item!r}: a label value is at most 63 letters, digits, "
                             "'-', '_' or '.', starting and ending with a letter or digit")
    return value


LABELS_CHECK = AfterValidator(_labels_fit)
LABEL_KEY_RULES = [{"rule": f"self.all(k, size(k) <= 317 && k.matches('{ANNOTATION_KEY}'))",
                    "message": "label keys must be qualified names ([prefix/]name)"}]
# A matchLabels map: bounded keys and values, checked both sides.
LabelMap = Annotated[dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]],
                     Field(max_length=SELECTOR_MAX_LABELS, json_schema_extra={"x-kubernetes-validations": LABEL_KEY_RULES}),
                     LABELS_CHECK]



def _annotations_fit(value: dict[str, str]) -> dict[str, str]:
    bad = [k for k in value if len(k) > DNS_SUBDOMAIN_MAX + 64 or not re.fullmatch(ANNOTATION_KEY, k)
           or "/" in k and len(k.split("/")[0]) > DNS_SUBDOMAIN_MAX]
    if bad:
        raise ValueError(f"annotation keys {bad} are not qualified names ([prefix/]name: a DNS-subdomain "
                         "prefix, a name of at most 63 letters, digits, '-', '_' or '.')")
    size = sum(len(k) + len(v) for k, v in value.items())
    if size > ANNOTATIONS_MAX_CHARS:
        raise ValueError(f"annotations hold {size} characters of keys and values; at most "
                         f"{ANNOTATIONS_MAX_CHARS} fit in a pod (Kubernetes caps them at 256 KiB in all)")
    return value


ANNOTATION_RULES = [
    {"rule": f"self.all(k, k.matches('{ANNOTATION_KEY}') && "
             f"(!k.contains('/') || k.indexOf('/') <= {DNS_SUBDOMAIN_MAX}))",
     "message": "annotation keys must be qualified names ([prefix/]name: a DNS-subdomain prefix, a name "
                "of at most 63 letters, digits, '-', '_' or '.')"},
    {"rule": f"self.map(k, size(k) + size(self[k])).sum() <= {ANNOTATIONS_MAX_CHARS}",
     "message": f"annotations may hold at most {ANNOTATIONS_MAX_CHARS} characters of keys and values "
                "(Kubernetes caps a pod's annotations at 256 KiB in all)"},
]


def pod_annotations(description: str) -> Any:
    """The type of a podAnnotations map: bounded keys, values and total size, checked both sides."""
    return Annotated[
        dict[str, Annotated[str, Field(max_length=ANNOTATIONS_MAX_CHARS)]],
        Field(default_factory=dict, max_length=ANNOTATIONS_MAX_KEYS, description=description,
              json_schema_extra={"x-kubernetes-validations": ANNOTATION_RULES}),
        AfterValidator(_annotations_fit)]


def tensor_bytes(data_type: str, dims: list[int], batch: int) -> int:
    """Bytes of one tensor in a batch of `batch` items, each of shape `dims` (no -1 left)."""
    count = batch
    for d in dims:
        count *= d
    return count * ELEMENT_BYTES[data_type]


def tensor_too_big(where: str, name: str, data_type: str, dims: list[int], batch: int,
                   batch_field: str) -> str | None:
    """A message naming the tensor when a batch of `batch` (what `batch_field` says) would exceed
    TENSOR_MAX_BYTES."""
    if any(d < 1 for d in dims):
        return None  # a dimension still variable: the maxDims rule reports that
    size = tensor_bytes(data_type, dims, batch)
    if size <= TENSOR_MAX_BYTES:
        return None
    shape = " x ".join(str(d) for d in [batch, *dims])
    return (f"{where} ({name}): a batch of {shape} {data_type} is {size:.3g} bytes at {batch_field} {batch}; "
            f"a request may carry at most {TENSOR_MAX_BYTES // 1024 ** 3} GiB per tensor: lower its "
            f"dims/maxDims or {batch_field}")


def tensor_bytes_cel(tensor: str, batch: str) -> str:
    """CEL for `tensor_bytes` of a tensor map (dims, maxDims, dataType), in doubles (no overflow)."""
    dims = f"(has({tensor}.maxDims) ? {tensor}.maxDims : {tensor}.dims)"
    factors = " * ".join(f"(size({dims}) > {i} ? double({dims}[{i}]) : 1.0)" for i in range(8))
    sizes = "{" + ", ".join(f"'{k}': {v}.0" for k, v in ELEMENT_BYTES.items()) + "}"
    return f"double({batch}) * {factors} * {sizes}[{tensor}.dataType]"
