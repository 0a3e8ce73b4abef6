"""kopf's diff base keeps nothing (controller/diffbase.py): rankops has no change handlers, so the
essence kopf builds per watch event (a deep copy of the whole body) served nothing. This fails
if a change handler comes back, which would need a real diff base again; and a body kopf is
handed is neither copied nor annotated, however large."""
from __future__ import annotations

import kopf

from rankops.controller import handlers, runtime  # noqa: F401 - registers the handlers with kopf


def storage() -> kopf.DiffBaseStorage:
    settings = kopf.OperatorSettings()
    runtime.configure_kopf(settings, workers=16)
    return settings.persistence.diffbase_storage


def test_rankops_registers_no_change_handler_so_no_diff_base_is_needed():
    registry = kopf.get_default_registry()
    assert registry._watching.get_all_handlers(), "the event handlers are registered"
    assert not registry._changing.get_all_handlers(), \
        "a kopf change handler needs a diff base: controller/diffbase.NoDiffBaseStorage keeps none"
    assert not registry._spawning.get_all_handlers(), "timers and daemons: the controllers' clocks do that"


def test_no_essence_is_built_or_stored_whatever_the_body():
    store = storage()
    big = kopf.Body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns",
                     "managedFields": [{"manager": "x", "fieldsV1": {f"f:{i}": {} for i in range(5000)}}]},
                     "spec": {"containers": [{"name": "c", "args": ["x" * 300_000]}]}, "status": {}})
    essence = store.build(body=big, extra_fields=None)
    assert essence == {} and store.fetch(body=big) == essence, "no diff, so no change cause"
    patch = kopf.Patch()
    store.store(body=big, patch=patch, essence=essence)
    assert not patch, "no annotation written"
