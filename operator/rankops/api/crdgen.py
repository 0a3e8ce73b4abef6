"""Generate CustomResourceDefinitions from the pydantic models (the single source of truth).

Pydantic's JSON Schema is made Kubernetes-structural here: $refs inlined, `anyOf [X, null]`
collapsed to X (nullable when its default is not null), titles dropped, enums and defaults kept,
and extensions (CEL rules, preserve-unknown-fields) carried through.
"""
from __future__ import annotations

import copy
from typing import Any

import yaml

GROUP = "rankops.io"
VERSION = "v1alpha1"

# JSON Schema keywords the API server's structural schema understands.
_KEEP = {
    "type", "properties", "items", "required", "description", "enum", "default", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems", "pattern",
    "additionalProperties", "format", "nullable", "minProperties", "maxProperties",
}


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    if isinstance(schema, list):
        return [_inline(s, defs) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        target = copy.deepcopy(defs[schema["$ref"].split("/")[-1]])
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _inline(merged, defs)
    return {k: _inline(v, defs) for k, v in schema.items()}


def _structural(schema: dict[str, Any]) -> dict[str, Any]:
    """Rewrite one inlined pydantic schema node into a structural OpenAPI v3 node."""
    schema = dict(schema)
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        # Union fields (e.g. batching: auto | {...}): the operator validates them with pydantic.
        out = {"x-kubernetes-preserve-unknown-fields": True}
        if "description" in schema:
            out["description"] = schema["description"]
        return out
    variants = schema.pop("anyOf", None)
    if variants is not None:
        non_null = [v for v in variants if v.get("type") != "null"]
        if len(non_null) != 1:
            raise ValueError(f"cannot make a structural schema of anyOf {variants}: mark the field "
                             "x-kubernetes-preserve-unknown-fields")
        base = _structural(non_null[0])
        base.update({k: v for k, v in schema.items() if k in ("description", "default")})
        if len(variants) > 1 and schema.get("default") is not None:
            # null is a value here, not "unset": without nullable the API server prunes it and
            # fills in the default.
            base["nullable"] = True
        schema = base
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties":
            out["properties"] = {name: _structural(sub) for name, sub in value.items()}
        elif key == "items":
            out["items"] = _structural(value)
        elif key == "additionalProperties":
            out["additionalProperties"] = _structural(value) if isinstance(value, dict) else value
        elif key == "const":
            out["enum"] = [value]
            out.setdefault("type", "string")
        elif key == "default" and value is None:
            continue
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema 2020 gives the bound; OpenAPI v3.0 (Kubernetes) wants bound + flag.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key in _KEEP or key.startswith("x-kubernetes-"):
            out[key] = value
    if out.get("additionalProperties") is False:
        del out["additionalProperties"]  # extra=forbid: the API server prunes unknown fields anyway
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "required" in out and "properties" in out:
        # Fields with defaults are not required on the wire: the API server fills them in.
        out["required"] = [r for r in out["required"] if "default" not in out["properties"].get(r, {})]
        if not out["required"]:
            del out["required"]
    return out


def _place_rules(schema: dict[str, Any], path: str, rules: list[dict]) -> None:
    """`path` "" is the object itself (where CEL may read metadata.name)."""
    node = schema
    for part in path.split(".") if path else ():
        many = part.endswith("[]")
        node = node["properties"][part.removesuffix("[]")]
        if many:
            node = node["items"]
    node.setdefault("x-kubernetes-validations", []).extend(rules)


def openapi_schema(model: type) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema = _structural(_inline(raw, defs))
    crd = model.__crd__
    for path, rules in crd.get("validations", {}).items():
        _place_rules(schema, path, rules)
    props = schema["properties"]
    props["metadata"] = {"type": "object"}  # the API server refuses anything more (even a description)
    props["apiVersion"] = {"type": "string", "description": f"{GROUP}/{VERSION}."}
    props["kind"] = {"type": "string", "description": f"{crd['kind']}."}
    schema["required"] = ["spec"]
    return schema


def crd_for(model: type) -> dict[str, Any]:
    meta = model.__crd__
    schema = openapi_schema(model)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{meta['plural']}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": meta["scope"],
            "names": {
                "kind": meta["kind"], "plural": meta["plural"], "singular": meta["singular"],
                "shortNames": meta["shortNames"], "categories": meta["categories"],
            },
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": meta["printerColumns"],
                "schema": {"openAPIV3Schema": schema},
            }],
        },
    }


def admission_policy(model: type) -> list[dict[str, Any]]:
    """ValidatingAdmissionPolicy (+ binding) for rules the CRD schema cannot express."""
    meta = model.__crd__
    rules = meta.get("admission")
    if not rules:
        return []
    name = f"{meta['plural']}.{GROUP}"
    return [{
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [GROUP], "apiVersions": [VERSION], "operations": ["CREATE", "UPDATE"],
                "resources": [meta["plural"]]}]},
            "validations": [dict(rule) for rule in rules],
        },
    }, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }]


def all_crds() -> list[dict[str, Any]]:
    from rankops.api.gpunodepool import GpuNodePool
    from rankops.api.rankingmodel import RankingModel
    from rankops.api.sharedserver import SharedServer
    return [crd_for(GpuNodePool), crd_for(RankingModel), crd_for(SharedServer)]


def crd_files() -> dict[str, str]:
    """File name -> YAML text, as checked in under crds/."""
    from rankops.api.rankingmodel import RankingModel
    header = "# Generated by `rankops crds --write crds/` from rankops.api; do not edit.\n"
    files = {
        f"{crd['spec']['names']['plural']}.{GROUP}.yaml":
            header + yaml.safe_dump(crd, sort_keys=False, width=100)
        for crd in all_crds()
    }
    policy = admission_policy(RankingModel)
    files[f"{RankingModel.__crd__['plural']}.{GROUP}-policy.yaml"] = header + yaml.safe_dump_all(
        policy, sort_keys=False, width=100)
    return files
