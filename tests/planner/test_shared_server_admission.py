"""Issue 42: a named shared server admits its members in arrival order, by memory and by each
member's P99 beside the others; a newcomer waits with the arithmetic, never evicting one that serves."""
import pytest

from rankops.planner import MemoryNeeds
from rankops.planner.pack import Card, PackError, pack
from rankops.planner.shared_server import admit
from test_pack import LIGHT, T4, model

BIG = MemoryNeeds(weights_mib=7000, runtime_reserve_mib=1024)   # two of them do not fit a T4


def test_light_members_all_admitted_on_the_cards_pack_would_use():
    admission = admit(LIGHT, Card(T4))
    assert admission.admitted == ("coarse", "fine", "rerank")
    assert not admission.waiting and not admission.refused and not admission.over
    assert admission.cards == pack(LIGHT, Card(T4)).gpus
    assert {m.name for m in admission.server.models} == {"coarse", "fine", "rerank"}
    assert admission.why("fine") is None


def test_a_member_over_memory_waits_naming_itself_and_the_sum():
    members = [model("first", 200, memory=BIG), model("second", 200, memory=BIG), model("third", 100)]
    admission = admit(members, Card(T4))
    assert admission.admitted == ("first", "third")
    (name, why), = admission.waiting
    assert name == "second"
    assert why.startswith("second does not fit on one GPU beside first:")
    assert "1 x 7000 MiB (first) + 1 x 7000 MiB (second) + 1024 MiB runtime reserve" in why
    assert "does not fit" in why and admission.why("second") == why


def test_a_newcomer_never_evicts_a_member_already_admitted():
    # `late` arrived first but `early` is the one serving: it keeps its place
    late, early = model("late", 200, memory=BIG), model("early", 200, memory=BIG)
    fresh = admit([late, early], Card(T4))
    assert fresh.admitted == ("late",) and [n for n, _ in fresh.waiting] == ["early"]
    held = admit([late, early], Card(T4), already_admitted={"early"})
    assert held.admitted == ("early",) and [n for n, _ in held.waiting] == ["late"]


def test_one_removed_frees_room_for_the_first_waiting_member_that_fits():
    a, b, c = (model(n, 200, memory=BIG) for n in ("a", "b", "c"))
    assert admit([a, b, c], Card(T4)).admitted == ("a",)
    after = admit([b, c], Card(T4), already_admitted={"a"})        # a deleted: b, the older, goes in
    assert after.admitted == ("b",) and [n for n, _ in after.waiting] == ["c"]


def test_p99_binds_before_memory_within_the_card_cap():
    busy = [model("left", 1800, p99=6.0), model("right", 1800, p99=6.0)]
    alone = admit(busy[:1], Card(T4)).cards
    capped = admit(busy, Card(T4, max_cards=alone))
    assert capped.admitted == ("left",)
    (name, why), = capped.waiting
    assert name == "right" and f"right does not hold beside left on {alone} GPU(s)" in why
    assert "P99" in why or "sustains" in why
    # uncapped, a member may take up to what it would alone: here sharing never holds within that
    assert [n for n, _ in admit(busy, Card(T4)).waiting] == ["right"]
    lighter = [model("left", 1000), model("right", 1000)]
    grown = admit(lighter, Card(T4))                               # the server grows by a card
    assert grown.admitted == ("left", "right") and grown.cards == admit(lighter[:1], Card(T4)).cards + 1


def test_a_member_the_planner_cannot_read_is_refused_without_blocking_the_others():
    bad = model("no-memory", 100, memory=None)
    admission = admit([bad, *LIGHT], Card(T4))
    assert admission.admitted == ("coarse", "fine", "rerank")
    (name, why), = admission.refused
    assert name == "no-memory" and "spec.planning.memory" in why


def test_an_admitted_member_that_grew_is_reported_over_and_keeps_its_place():
    grown = model("fine", 400, memory=MemoryNeeds(weights_mib=14000, runtime_reserve_mib=1024))
    admission = admit([LIGHT[0], grown, LIGHT[2]], Card(T4), already_admitted={"coarse", "fine", "rerank"})
    assert "fine" not in admission.admitted and admission.admitted == ("coarse", "rerank")
    (name, why), = admission.over
    assert name == "fine" and "does not fit" in why
    # while fine's grown needs are not placed, a newcomer waits: fine's room is still taken
    late = admit([LIGHT[0], grown, LIGHT[2], model("late", 50)], Card(T4), already_admitted={"coarse", "fine", "rerank"})
    assert late.admitted == ("coarse", "rerank") and "late waits: fine already serve(s) here" in late.why("late")


def test_switch_room_and_a_member_bigger_than_the_cap():
    six, mid = MemoryNeeds(weights_mib=6000, runtime_reserve_mib=1024), MemoryNeeds(1500, runtime_reserve_mib=1024)
    assert admit([model("a", 200, memory=six), model("b", 50, memory=mid)], Card(T4)).admitted == ("a", "b")
    squeezed = admit([model("a", 200, memory=six), model("b", 50, memory=mid)], Card(T4, switch_room=True))
    assert [n for n, _ in squeezed.waiting] == ["b"] and "a's next version" in squeezed.why("b")
    too_many = admit([model("huge", 20000)], Card(T4, max_cards=1))
    assert too_many.admitted == () and "over the server's 1" in too_many.why("huge")


def test_names_must_differ_and_admission_is_deterministic():
    with pytest.raises(PackError):
        admit([model("x", 100), model("x", 200)], Card(T4))
    assert admit(LIGHT, Card(T4)) == admit(LIGHT, Card(T4))
