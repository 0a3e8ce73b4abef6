"""Issue 42: a shared server's pod actions and member states, from the pod's repository index (pure)."""
import copy

from rankops import serverplan
from rankops.api.rankingmodel import RankingModel
from rankops.api.sharedserver import SharedServerSpec
from rankops.render.shared_server import member_config, server_arguments
from rankops.render.desired import resolve_shape
from rankops.triton.repository import IndexEntry

E = IndexEntry


def test_a_converged_pod_asks_for_nothing_twice():
    index = [E("coarse", 1, "READY"), E("fine", 2, "READY")]
    assert serverplan.pod_actions({"coarse": 1, "fine": 2}, index).nothing


def test_absent_members_load_and_strangers_unload():
    index = [E("coarse", 1, "READY"), E("gone", 3, "READY"), E("old", 1, "UNAVAILABLE", "unloaded")]
    actions = serverplan.pod_actions({"coarse": 1, "fine": 1, "old": 1}, index)
    assert actions.load == ("fine", "old") and actions.unload == ("gone",)


def test_a_new_version_is_a_reload_and_a_loading_member_is_left_alone():
    index = [E("fine", 1, "READY"), E("coarse", 4, "LOADING")]
    actions = serverplan.pod_actions({"fine": 2, "coarse": 4}, index)
    assert actions.load == ("fine",) and not actions.unload
    assert serverplan.member_state("coarse", 4, index).state == serverplan.LOADING


def test_a_refused_load_outranks_a_stale_index_entry_and_transitions_wait():
    index = [E("fine", 1, "UNAVAILABLE", "unloaded"), E("coarse", 2, "UNLOADING")]
    assert serverplan.member_state("fine", 1, index, "load failed: no file").state == serverplan.FAILED
    assert serverplan.pod_actions({"fine": 1, "coarse": 2}, index, {"fine": "load failed: no file"}).nothing
    assert serverplan.member_state("coarse", 2, index).state == serverplan.LOADING


def test_a_member_beside_an_old_version_is_loaded_again_to_drop_it():
    index = [E("fine", 1, "READY"), E("fine", 2, "READY")]
    assert serverplan.pod_actions({"fine": 2}, index).load == ("fine",)
    assert serverplan.pod_actions({"fine": 2}, [E("fine", 1, "UNAVAILABLE", "unloaded"), E("fine", 2, "READY")]).nothing


def test_failed_members_say_why_and_wait_for_a_retry():
    index = [E("fine", 1, "UNAVAILABLE", "failed to load 'fine' version 1: Invalid argument: onnx bad")]
    state = serverplan.member_state("fine", 1, index)
    assert state.state == serverplan.FAILED and "onnx bad" in state.reason
    assert serverplan.pod_actions({"fine": 1}, index).nothing
    assert serverplan.pod_actions({"fine": 1}, index, retry_failed=True).load == ("fine",)
    refused = {"coarse": "load failed: at least one version must be available"}
    assert serverplan.member_state("coarse", 1, [], refused["coarse"]).state == serverplan.FAILED
    assert serverplan.pod_actions({"coarse": 1}, [], refused).nothing
    assert serverplan.member_state("coarse", 1, []).state == serverplan.ABSENT


def test_a_refused_config_edit_waits_its_backoff_and_a_fixed_one_goes_at_once():
    """The pod serves fine with config d0; the edit d1 was refused there (Triton keeps d0 serving):
    not sent again every round, but once the backoff is over, or at once for another edit d2."""
    index = [E("fine", 1, "READY")]
    refusal = {"fine": "load of fine refused: unexpected shape"}
    kept = dict(load_errors=refusal, configs={"fine": "d1"}, loaded={"fine": "d0"}, refused={"fine": "d1"})
    assert serverplan.member_state("fine", 1, index, refusal["fine"]).state == serverplan.SERVING
    assert serverplan.pod_actions({"fine": 1}, index, retry_failed=(), **kept).nothing
    assert serverplan.pod_actions({"fine": 1}, index, retry_failed={"fine"}, **kept).load == ("fine",)
    fixed = {**kept, "configs": {"fine": "d2"}}
    assert serverplan.pod_actions({"fine": 1}, index, retry_failed=(), **fixed).load == ("fine",)
    # a failed member too: its backoff, or at once with another config
    failed = [E("fine", 1, "UNAVAILABLE", "failed to load")]
    assert serverplan.pod_actions({"fine": 1}, failed, refusal, (), configs={"fine": "d1"}, refused={"fine": "d1"}).nothing
    assert serverplan.pod_actions({"fine": 1}, failed, refusal, (), configs={"fine": "d2"},
                                  refused={"fine": "d1"}).load == ("fine",)


def _spec():
    doc = {"apiVersion": "rankops.io/v1alpha1", "kind": "RankingModel", "metadata": {"name": "m", "namespace": "n"},
           "spec": {"version": "1", "versions": [{"name": "1", "modelUri": "s3://b/m/1", "format": "onnx"}],
                    "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
                    "outputs": [{"name": "y", "dataType": "FP32", "dims": [1]}],
                    "batching": {"maxBatchSize": 8}}}
    return RankingModel.model_validate(copy.deepcopy(doc))


def test_the_server_starts_with_no_model_and_its_own_flags():
    args = server_arguments(SharedServerSpec(gpuMemoryMiB=15360, responseCache=True, disruption={"exitTimeoutSeconds": 40}))
    assert "--model-control-mode=explicit" in args and "--strict-readiness=false" in args
    assert "--allow-grpc=false" in args
    assert not any(a.startswith("--load-model") for a in args)
    assert "--exit-timeout-secs=40" in args and any(a.startswith("--cache-config") for a in args)
    assert not any(a.startswith("--cache-config") for a in server_arguments(SharedServerSpec(gpuMemoryMiB=15360)))


def test_a_member_is_loaded_with_the_config_it_would_serve_alone():
    rm = _spec()
    version, text = member_config("m", "n", rm.spec, "1", resolve_shape(rm.spec).shape)
    assert version == 1 and 'name: "m"' in text and "max_batch_size: 8" in text
