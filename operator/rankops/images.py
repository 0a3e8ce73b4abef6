"""The images this project builds (images/Dockerfile, one target per kind) and the names every default uses.

One source of truth: the API defaults (spec.fetcherImage, spec.rollout.gateJobs.image,
spec.validator.image), the chart's values and images/README.md all name these, and
tests/test_images.py fails when a default names an image no Dockerfile builds. Names stay
`rankops-<kind>`.
"""
from __future__ import annotations

REGISTRY = "quay.io/rankops"
VERSION = "0.1.0"  # the package's version and the chart's appVersion (tests check all three agree)

# kind -> repository name; images/Dockerfile's target <kind> builds it.
REPOSITORIES = {
    "operator": "rankops-operator",
    "validator": "rankops-validator",
    "gates": "rankops-gates",
}


def image(kind: str, registry: str = REGISTRY, version: str = VERSION) -> str:
    return f"{registry}/{REPOSITORIES[kind]}:{version}"


OPERATOR_IMAGE = image("operator")
VALIDATOR_IMAGE = image("validator")
GATES_IMAGE = image("gates")
# fetch-model runs in every serving pod's init container: the operator image carries it (the
# package with boto3) without the gates image's torch, so each Triton pod pulls the small one.
FETCHER_IMAGE = OPERATOR_IMAGE

LOCK_PATH = "images/requirements.lock"


def dependency_closure(root: str = "rankops") -> dict[str, str]:
    """name -> installed version of every distribution `root` needs at run time in this
    environment (markers evaluated here; extras followed), `root` itself left out."""
    import re
    from importlib.metadata import distribution

    from packaging.requirements import Requirement

    found: dict[str, str] = {}

    def walk(name: str, extras: frozenset[str]) -> None:
        dist = distribution(name)
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if key in found:
            return
        found[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
                continue
            walk(req.name, frozenset(req.extras))

    walk(root, frozenset())
    found.pop(root, None)
    return dict(sorted(found.items()))


def lock_text() -> str:
    header = ("# Pinned runtime dependencies of the rankops images (pip install -c): the set the tests run.\n"
              "# Regenerate from the project's virtualenv: python -m rankops.images > images/requirements.lock\n")
    return header + "".join(f"{name}=={version}\n" for name, version in dependency_closure().items())


if __name__ == "__main__":
    print(lock_text(), end="")
