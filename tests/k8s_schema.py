"""Validates Kubernetes manifests against the CustomResourceDefinitions they are for.

    python k8s_schema.py MANIFESTS.yaml CRD.yaml [CRD.yaml …]

Each document whose apiVersion/kind a CRD defines is checked against that version's
openAPIV3Schema — strictly: a field the schema does not name is an error (the API server's
strict field validation, `kubectl apply --validate=strict`, treats it so; without it the
field would be dropped silently). A ConfigMap is checked for its few rules. Exit 1 on any
error, each printed with its path. Needs PyYAML and jsonschema.
"""

import sys

import jsonschema
import yaml


def strict(schema):
    """The schema with unknown fields refused wherever it lists the fields of an object."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        out.get("type") == "object"
        and isinstance(out.get("properties"), dict)
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def schemas(crd_paths):
    found = {}
    for path in crd_paths:
        with open(path) as f:
            crd = yaml.safe_load(f)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            found[(f"{group}/{v['name']}", kind)] = strict(v["schema"]["openAPIV3Schema"])
    return found


def check_config_map(doc):
    errors = []
    if not isinstance(doc.get("data"), dict) or not all(
        isinstance(v, str) for v in doc["data"].values()
    ):
        errors.append("data: a map of strings")
    unknown = set(doc) - {"apiVersion", "kind", "metadata", "data", "binaryData", "immutable"}
    if unknown:
        errors.append(f"unknown fields {sorted(unknown)}")
    return errors


def main():
    manifests, crds = sys.argv[1], sys.argv[2:]
    known = schemas(crds)
    with open(manifests) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    failures, checked = 0, 0
    for i, doc in enumerate(docs):
        api, kind = doc.get("apiVersion"), doc.get("kind")
        name = (doc.get("metadata") or {}).get("name", "?")
        where = f"document {i} ({kind} {name})"
        if (api, kind) == ("v1", "ConfigMap"):
            errors = check_config_map(doc)
        elif (api, kind) in known:
            validator = jsonschema.Draft7Validator(known[(api, kind)])
            errors = [
                f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
                for e in validator.iter_errors(doc)
            ]
        else:
            errors = [f"no schema for {api} {kind}"]
        checked += 1
        for e in errors:
            print(f"{where}: {e}")
        failures += len(errors)
    print(f"{checked} document(s) checked, {failures} error(s)")
    sys.exit(1 if failures or not checked else 0)


if __name__ == "__main__":
    main()
