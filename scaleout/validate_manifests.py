"""Offline check of the Kubernetes manifests in scaleout/k8s/ (no cluster needed).

    .venv-ray/bin/python scaleout/validate_manifests.py scaleout/k8s/*.yaml

Core kinds (Job, PersistentVolumeClaim, ConfigMap, Service, Pod) are built field by field into
the models of the official Kubernetes Python client (PyPI `kubernetes`, generated from the
Kubernetes OpenAPI schema): a field the schema does not have, a value of the wrong type (string,
integer, boolean, list, map) or a missing required field is an error naming the document and
the path, e.g. `indexed-job.yaml#1: spec.template.spec.containers[0]: unknown field
"imagePullPolcy"`.

KubeRay's RayCluster and RayJob (apiVersion ray.io/v1) are custom resources the client has no
models for. Their own fields are checked against the tables below, written from KubeRay's v1
API types (ray-operator/apis/ray/v1/raycluster_types.go and rayjob_types.go: field names, JSON
types, the fields those types require), and every Kubernetes object embedded in them (each
group's pod `template`, the submitter pod template, the head service, the autoscaler's
resources) is checked fully against the client's models as above. Not checked: the CRD's CEL
rules and defaults, and anything only the API server or the operator knows (names that must be
unique, quantities that must parse, resources that must exist).
"""

import re
import sys

import kubernetes.client as k8s
import yaml

CORE_KINDS = {
    ("batch/v1", "Job"): "V1Job",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "Pod"): "V1Pod",
}

# KubeRay v1 types: field -> (type, required). A type is a primitive ("str", "int", "float",
# "bool"), "map[str]str", "list[T]", the name of another table, or a Kubernetes client model.
KUBERAY = {
    "RayCluster": {
        "apiVersion": ("str", True),
        "kind": ("str", True),
        "metadata": ("V1ObjectMeta", True),
        "spec": ("RayClusterSpec", True),
    },
    "RayJob": {
        "apiVersion": ("str", True),
        "kind": ("str", True),
        "metadata": ("V1ObjectMeta", True),
        "spec": ("RayJobSpec", True),
    },
    "RayClusterSpec": {
        "headGroupSpec": ("HeadGroupSpec", True),
        "workerGroupSpecs": ("list[WorkerGroupSpec]", False),
        "rayVersion": ("str", False),
        "enableInTreeAutoscaling": ("bool", False),
        "autoscalerOptions": ("AutoscalerOptions", False),
        "headServiceAnnotations": ("map[str]str", False),
        "suspend": ("bool", False),
    },
    "HeadGroupSpec": {
        "serviceType": ("str", False),
        "headService": ("V1Service", False),
        "enableIngress": ("bool", False),
        "rayStartParams": ("map[str]str", True),
        "template": ("V1PodTemplateSpec", True),
    },
    "WorkerGroupSpec": {
        "groupName": ("str", True),
        "replicas": ("int", False),
        "minReplicas": ("int", True),
        "maxReplicas": ("int", True),
        "numOfHosts": ("int", False),
        "rayStartParams": ("map[str]str", True),
        "template": ("V1PodTemplateSpec", True),
        "scaleStrategy": ("ScaleStrategy", False),
    },
    "ScaleStrategy": {
        "workersToDelete": ("list[str]", False),
    },
    "AutoscalerOptions": {
        "resources": ("V1ResourceRequirements", False),
        "image": ("str", False),
        "imagePullPolicy": ("str", False),
        "env": ("list[V1EnvVar]", False),
        "envFrom": ("list[V1EnvFromSource]", False),
        "volumeMounts": ("list[V1VolumeMount]", False),
        "securityContext": ("V1SecurityContext", False),
        "idleTimeoutSeconds": ("int", False),
        "upscalingMode": ("str", False),
    },
    "RayJobSpec": {
        "activeDeadlineSeconds": ("int", False),
        "backoffLimit": ("int", False),
        "rayClusterSpec": ("RayClusterSpec", False),
        "submitterPodTemplate": ("V1PodTemplateSpec", False),
        "metadata": ("map[str]str", False),
        "clusterSelector": ("map[str]str", False),
        "submitterConfig": ("SubmitterConfig", False),
        "entrypoint": ("str", False),
        "runtimeEnvYAML": ("str", False),
        "jobId": ("str", False),
        "submissionMode": ("str", False),
        "entrypointResources": ("str", False),
        "entrypointNumCpus": ("float", False),
        "entrypointNumGpus": ("float", False),
        "ttlSecondsAfterFinished": ("int", False),
        "shutdownAfterJobFinishes": ("bool", False),
        "suspend": ("bool", False),
    },
    "SubmitterConfig": {
        "backoffLimit": ("int", False),
    },
}
ENUMS = {
    ("AutoscalerOptions", "upscalingMode"): {"Default", "Aggressive", "Conservative"},
    ("RayJobSpec", "submissionMode"): {"K8sJobMode", "HTTPMode", "InteractiveMode"},
    ("HeadGroupSpec", "serviceType"): {"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"},
}

# Maps whose values Kubernetes reads as quantities (int or string), not plain strings.
QUANTITY_MAPS = {"limits", "requests", "capacity"}


class Invalid(Exception):
    pass


def type_name(v):
    return {dict: "a map", list: "a list", str: "a string", bool: "a boolean", int: "an integer", float: "a number"}.get(
        type(v), type(v).__name__
    )


def check_primitive(value, t, path):
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "object": True,  # int-or-string and free-form fields
        "datetime": isinstance(value, str),
        "date": isinstance(value, str),
    }[t]
    if not ok:
        raise Invalid(f"{path}: expected {t}, found {type_name(value)} {value!r}")
    return value


def build_model(value, t, path):
    """Checks `value` against the client type string `t` and returns the built value."""
    if t in ("str", "int", "float", "bool", "object", "datetime", "date"):
        return check_primitive(value, t, path)
    # The client writes its types as `list[T]` / `dict(str, T)` (older releases) or
    # `List[T]` / `Dict[str, T]` (newer ones).
    m = re.fullmatch(r"[lL]ist\[(.+)\]", t)
    if m:
        if not isinstance(value, list):
            raise Invalid(f"{path}: expected a list, found {type_name(value)}")
        return [build_model(v, m.group(1), f"{path}[{i}]") for i, v in enumerate(value)]
    m = re.fullmatch(r"dict\(str, (.+)\)", t) or re.fullmatch(r"Dict\[str, (.+)\]", t)
    if m:
        if not isinstance(value, dict):
            raise Invalid(f"{path}: expected a map, found {type_name(value)}")
        inner = m.group(1)
        if inner == "str" and path.rsplit(".", 1)[-1] in QUANTITY_MAPS:
            inner = "object"
        return {k: build_model(v, inner, f"{path}.{k}") for k, v in value.items()}
    klass = getattr(k8s, t, None)
    if klass is None:
        raise Invalid(f"{path}: the validator knows no type {t}")
    if not isinstance(value, dict):
        raise Invalid(f"{path}: expected a {t} object, found {type_name(value)}")
    by_json = {j: attr for attr, j in klass.attribute_map.items()}
    kwargs = {}
    for key, v in value.items():
        if key not in by_json:
            raise Invalid(f"{path or '<root>'}: unknown field {key!r} for {t} (known: {', '.join(sorted(by_json))})")
        attr = by_json[key]
        kwargs[attr] = build_model(v, klass.openapi_types[attr], f"{path}.{key}" if path else key)
    try:
        return klass(**kwargs)
    except ValueError as e:
        raise Invalid(f"{path or '<root>'}: {t}: {' '.join(str(e).split())}") from None


def check_kuberay(value, t, path):
    if t.startswith("list["):
        if not isinstance(value, list):
            raise Invalid(f"{path}: expected a list, found {type_name(value)}")
        for i, v in enumerate(value):
            check_kuberay(v, t[5:-1], f"{path}[{i}]")
        return
    if t == "map[str]str":
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise Invalid(f"{path}: expected a map of strings (quote numbers and booleans), found {value!r}")
        return
    if t in ("str", "int", "float", "bool"):
        check_primitive(value, t, path)
        return
    table = KUBERAY.get(t)
    if table is None:
        build_model(value, t, path)
        return
    if not isinstance(value, dict):
        raise Invalid(f"{path}: expected a {t} object, found {type_name(value)}")
    for key, v in value.items():
        if key not in table:
            raise Invalid(f"{path or '<root>'}: unknown field {key!r} for KubeRay {t} (known: {', '.join(sorted(table))})")
        field_type, _ = table[key]
        allowed = ENUMS.get((t, key))
        if allowed and v not in allowed:
            raise Invalid(f"{path}.{key}: {v!r} is not one of {sorted(allowed)}")
        check_kuberay(v, field_type, f"{path}.{key}" if path else key)
    for key, (_, required) in table.items():
        if required and key not in value:
            raise Invalid(f"{path or '<root>'}: KubeRay {t} needs field {key!r}")


def check_document(doc, where):
    if not isinstance(doc, dict):
        raise Invalid(f"{where}: a manifest must be a map, found {type_name(doc)}")
    api, kind = doc.get("apiVersion"), doc.get("kind")
    if api == "ray.io/v1" and kind in ("RayCluster", "RayJob"):
        check_kuberay(doc, kind, "")
        return f"{kind} (KubeRay fields + embedded Kubernetes objects)"
    model = CORE_KINDS.get((api, kind))
    if model is None:
        known = ", ".join(f"{a} {k}" for a, k in CORE_KINDS) + ", ray.io/v1 RayCluster, ray.io/v1 RayJob"
        raise Invalid(f"{where}: apiVersion {api!r} kind {kind!r} is not one this validator knows ({known})")
    build_model(doc, model, "")
    return f"{kind} ({model})"


def main(paths):
    if not paths:
        sys.exit("usage: validate_manifests.py MANIFEST.yaml…")
    failed = 0
    for p in paths:
        try:
            with open(p) as f:
                docs = [d for d in yaml.safe_load_all(f) if d is not None]
        except (OSError, yaml.YAMLError) as e:
            print(f"FAIL {p}: {e}")
            failed += 1
            continue
        for i, doc in enumerate(docs, 1):
            where = f"{p}#{i}"
            try:
                what = check_document(doc, where)
                print(f"ok   {where}: {what}")
            except Invalid as e:
                msg = str(e)
                print(f"FAIL {msg if msg.startswith(where) else where + ': ' + msg}")
                failed += 1
    if failed:
        sys.exit(f"{failed} manifest document(s) failed")


if __name__ == "__main__":
    main(sys.argv[1:])
