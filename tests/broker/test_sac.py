"""Single-active-consumer groups without sockets (riverlog.broker.sac): who is active, which
ConsumerUpdate notifications go out, failover in subscription order, step-down before a
rebalance on super-stream partitions, connection loss and stream deletion."""
import pytest

from riverlog.broker.sac import ACTIVE, INACTIVE, STEPPING_DOWN, Notification, SingleActiveConsumers


def on(owner, sub, active):
    return Notification(owner, sub, active)


def with_members(*members):
    """Groups "g" on plain streams with (stream, owner, subscription id) members, in order."""
    sac = SingleActiveConsumers()
    for stream, owner, sub in members:
        sac.register(stream, "g", -1, owner, sub)
    return sac


def states(sac, *members):
    return [sac.state(owner, sub) for owner, sub in members]


def test_plain_stream_first_member_active_then_next_in_subscription_order():
    sac = SingleActiveConsumers()
    assert sac.register("s", "g", -1, "A", 1) == [on("A", 1, True)]
    assert sac.register("s", "g", -1, "B", 7) == []
    assert sac.register("s", "g", -1, "C", 2) == []
    assert states(sac, ("A", 1), ("B", 7), ("C", 2)) == [ACTIVE, INACTIVE, INACTIVE]
    # an inactive member leaving changes nothing
    assert sac.unregister("C", 2) == []
    assert sac.register("s", "g", -1, "C", 3) == []
    # the active one leaves: the next in subscription order takes over
    assert sac.unregister("A", 1) == [on("B", 7, True)]
    assert sac.is_active("B", 7) and not sac.is_active("C", 3)
    assert sac.unregister("B", 7) == [on("C", 3, True)]
    assert sac.unregister("C", 3) == []
    assert sac.groups == {}
    assert sac.state("C", 3) is None


def test_groups_are_per_stream_and_name():
    sac = SingleActiveConsumers()
    assert sac.register("s", "g1", -1, "A", 1) == [on("A", 1, True)]
    assert sac.register("s", "g2", -1, "A", 2) == [on("A", 2, True)]
    assert sac.register("t", "g1", -1, "B", 1) == [on("B", 1, True)]
    assert sac.register("s", "g1", -1, "B", 2) == []
    assert set(sac.groups) == {("s", "g1"), ("s", "g2"), ("t", "g1")}
    with pytest.raises(ValueError):
        sac.register("s", "g2", -1, "A", 1)  # subscription 1 of A is already a member


def test_unknown_members_are_ignored():
    sac = SingleActiveConsumers()
    assert sac.unregister("A", 1) == []
    assert sac.stepped_down("A", 1) == []
    assert sac.unregister_owner("A") == []
    sac.register("s", "g", -1, "A", 1)
    assert sac.stepped_down("A", 1) == []  # active, not stepping down: nothing happens
    assert sac.is_active("A", 1)


def test_connection_loss_removes_all_its_members_and_notifies_only_others():
    # A has two members in group (t, g)
    sac = with_members(("s", "A", 1), ("t", "A", 2), ("s", "B", 1), ("t", "A", 3), ("t", "C", 1))
    assert sac.unregister_owner("A") == [on("B", 1, True), on("C", 1, True)]
    assert states(sac, ("B", 1), ("C", 1)) == [ACTIVE, ACTIVE]
    assert sac.state("A", 3) is None


def test_super_stream_partitions_spread_the_active_members():
    """Partition i of a super stream wants member i % n active (RabbitMQ): with three
    consumers each subscribed to three partitions, each one is active on one partition."""
    sac = SingleActiveConsumers()
    notes = []
    for owner in "ABC":
        for index in range(3):
            notes += sac.register(f"p-{index}", "g", index, owner, index)
        # answer every step-down at once, as a client does
        while any(not n.active for n in notes):
            step = next(n for n in notes if not n.active)
            notes.remove(step)
            notes += sac.stepped_down(step.owner, step.subscription_id)
    active = {(o, s) for o in "ABC" for s in range(3) if sac.is_active(o, s)}
    assert active == {("A", 0), ("B", 1), ("C", 2)}


def test_rebalance_steps_down_first_and_activates_after_the_answer():
    sac = SingleActiveConsumers()
    assert sac.register("p-1", "g", 1, "A", 1) == [on("A", 1, True)]
    # B joins: partition 1 wants member 1 % 2 = B; A is asked to step down, B waits
    assert sac.register("p-1", "g", 1, "B", 1) == [on("A", 1, False)]
    assert states(sac, ("A", 1), ("B", 1)) == [STEPPING_DOWN, INACTIVE]
    # a third member while A still steps down: nothing more happens yet
    assert sac.register("p-1", "g", 1, "C", 1) == []
    # A answers: now the wanted one (1 % 3 = B) is activated
    assert sac.stepped_down("A", 1) == [on("B", 1, True)]
    assert states(sac, ("A", 1), ("B", 1), ("C", 1)) == [INACTIVE, ACTIVE, INACTIVE]
    # A leaves: 1 % 2 = C is wanted, B steps down first
    assert sac.unregister("A", 1) == [on("B", 1, False)]
    assert sac.stepped_down("B", 1) == [on("C", 1, True)]


def test_member_leaving_while_stepping_down_activates_the_wanted_one():
    sac = SingleActiveConsumers()
    sac.register("p-1", "g", 1, "A", 1)
    assert sac.register("p-1", "g", 1, "B", 1) == [on("A", 1, False)]
    # A disconnects before answering: B is activated at once
    assert sac.unregister_owner("A") == [on("B", 1, True)]
    assert sac.is_active("B", 1)


def test_dropping_a_stream_forgets_its_groups_silently():
    sac = with_members(("s", "A", 1), ("s", "B", 1), ("t", "B", 2))
    sac.drop_stream("s")
    assert list(sac.groups) == [("t", "g")]
    assert sac.unregister("A", 1) == []
    assert sac.state("B", 1) is None and sac.is_active("B", 2)
    # the same subscription ids can join again
    assert sac.register("s", "g", -1, "B", 1) == [on("B", 1, True)]


def test_a_member_with_another_partition_index_is_refused():
    """RabbitMQ's coordinator answers partition_index_conflict (Subscribe: 0x11) when a group
    gets a member whose stream position differs from the group's."""
    sac = SingleActiveConsumers()
    assert sac.register("s-1", "g", 1, "A", 1) == [on("A", 1, True)]
    assert sac.conflicts("s-1", "g", -1) and not sac.conflicts("s-1", "g", 1)
    assert not sac.conflicts("s-1", "other", -1)
    with pytest.raises(ValueError):
        sac.register("s-1", "g", -1, "B", 1)
    assert [m.owner for m in sac.groups[("s-1", "g")].members] == ["A"]
