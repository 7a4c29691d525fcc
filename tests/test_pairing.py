"""Pair sweeps, the pure part (sweeper.pairing): groups, forming pairs, the verdict each node of a
pair run gets, and the re-pair bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeper.actions import load_all
from sweeper.config import Config, load_config
from sweeper.errors import ConfigError, PlaybookError
from sweeper.pairing import Repairs, form_pairs, group_key, node_verdicts, pair_status, partner_only
from sweeper.playbook.model import parse_playbook

LABELS = Config().pair_labels
ZONE = "topology.kubernetes.io/zone"
LAYER3 = "topology.k8s.aws/network-node-layer-3"


def key(profile: str = "p5.48xlarge", **labels: str) -> tuple[str, tuple[str | None, ...]]:
    return group_key(profile, labels, ["zone", "layer3"])


def test_group_key_needs_the_same_profile_and_the_same_placement_labels() -> None:
    """EKS labels each node with its place in the EC2 network hierarchy,
    `topology.k8s.aws/network-node-layer-1..3` (a 4th on some instance types); nodes that share
    the bottom layer's value are physically closest
    (docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html)."""
    a = group_key("p5", {ZONE: "use1-az1", LAYER3: "nn-1"}, LABELS)
    assert a == group_key("p5", {ZONE: "use1-az1", LAYER3: "nn-1", "other": "x"}, LABELS)
    assert a != group_key("p5", {ZONE: "use1-az1", LAYER3: "nn-2"}, LABELS)
    assert a != group_key("p4d", {ZONE: "use1-az1", LAYER3: "nn-1"}, LABELS)
    # absent on both: equal; present on one only: not a pair
    assert key(zone="a") == key(zone="a")
    assert key(zone="a") != key(zone="a", layer3="n1")


def test_the_default_pair_labels_and_the_window_come_from_the_config(tmp_path: Path) -> None:
    assert Config().pair_labels[0] == ZONE and Config().pair_known_good_window == 7 * 86400
    f = tmp_path / "c.yaml"
    f.write_text("pair_labels: [topology.kubernetes.io/zone]\npair_known_good_window: 2d\n")
    cfg = load_config(f)
    assert cfg.pair_labels == (ZONE,) and cfg.pair_known_good_window == 2 * 86400
    f.write_text("pair_known_good_window: 0s\n")
    with pytest.raises(ConfigError, match="pair_known_good_window"):
        load_config(f)


def test_form_pairs_keeps_the_due_order_within_groups_and_leaves_the_odd_node() -> None:
    groups = {"a1": "A", "b1": "B", "a2": "A", "a3": "A", "b2": "B", "c1": "C"}
    pairs = form_pairs(groups, lambda n: (groups[n], ()), room=8)
    assert pairs == [("a1", "a2"), ("b1", "b2")]  # a3 and c1 wait: no partner of their group


def test_a_pair_counts_two_against_the_room() -> None:
    names = ["n1", "n2", "n3", "n4", "n5", "n6"]
    assert form_pairs(names, lambda n: ("p", ()), room=5) == [("n1", "n2"), ("n3", "n4")]
    assert form_pairs(names, lambda n: ("p", ()), room=1) == []
    assert form_pairs(names, lambda n: ("p", ()), room=0) == []


@pytest.mark.parametrize("verdict,status", [("pass", "pass"), ("warn", "warn"), ("reboot", "fail"),
                                            ("replace", "fail"), ("quarantine", "fail"), ("error", "error"),
                                            ("inconclusive", "inconclusive")])
def test_the_pair_status_of_a_play_verdict(verdict: str, status: str) -> None:
    assert pair_status(verdict) == status


def test_a_failed_sweep_pair_blames_neither_node() -> None:
    a, b = node_verdicts("sweep", "n1", "n2", "quarantine", ["pair.nccl: bus bandwidth 190 < 400"])
    assert a.suspect and b.suspect and a.verdict == b.verdict == "inconclusive"
    assert a.reasons[0].startswith("pair with n2 failed: pair.nccl") and "re-pairing" in a.reasons[0]
    assert b.reasons[0].startswith("pair with n1 failed")


def test_a_failed_repair_names_the_suspect_and_frees_its_known_good_partner() -> None:
    s, k = node_verdicts("repair", "sus", "good", "replace", ["pair.nccl: low"])
    assert (s.verdict, s.suspect) == ("replace", False) and s.reasons[0] == "pair.nccl: low"
    assert (k.verdict, k.suspect, k.reasons) == ("inconclusive", False, ("failed with suspect sus",))


@pytest.mark.parametrize("hosts,blamed", [
    ({"good"}, False),  # the partner's own log alone: no word on the suspect
    ({"sus", "good"}, True),  # the suspect's own log says it too
    ({"sus"}, True),
    (set(), True),  # no finding named a log (the MPIJob form's launcher): the suspect's, as before
])
def test_a_re_pair_failed_on_its_partners_own_log_alone_blames_no_one(hosts: set[str], blamed: bool) -> None:
    """A node taken over prints its own log: as a known-good partner it could blame any suspect."""
    s, k = node_verdicts("repair", "sus", "good", "quarantine", ["pair.nccl: aborted on good"], hosts)
    if blamed:
        assert (s.verdict, s.suspect, k.verdict, k.suspect) == ("quarantine", False, "inconclusive", False)
        return
    assert (s.verdict, s.suspect, k.verdict, k.suspect) == ("inconclusive", True, "inconclusive", True)
    assert "failed on good's own log alone" in s.reasons[0] and "sus is not blamed" in s.reasons[0]
    assert "good is known-good no more" in k.reasons[0]
    s, k = node_verdicts("repair", "sus", "good", "quarantine", ["x"], hosts, repairs=False)
    assert (s.verdict, s.suspect, k.verdict, k.suspect) == ("inconclusive", False, "inconclusive", False)


def test_a_partners_log_alone_is_no_dispute_in_a_sweep_pair_nor_without_a_holding_verdict() -> None:
    assert partner_only("repair", "good", "replace", {"good"})
    assert not partner_only("sweep", "good", "replace", {"good"})
    assert not partner_only("repair", "good", "error", {"good"})
    assert not partner_only("repair", "good", "replace", {"good", "sus"})


@pytest.mark.parametrize("mode", ["sweep", "repair"])
@pytest.mark.parametrize("verdict", ["pass", "warn", "error", "inconclusive"])
def test_a_pair_that_did_not_fail_gives_both_nodes_its_verdict(mode: str, verdict: str) -> None:
    calls = node_verdicts(mode, "n1", "n2", verdict, ["why"])
    assert [(c.node, c.verdict, c.suspect) for c in calls] == [("n1", verdict, False), ("n2", verdict, False)]


def test_repairs_choose_a_known_good_idle_partner_of_the_group_never_the_first_partner() -> None:
    g, other = ("p5", ("az1",)), ("p5", ("az2",))
    book = Repairs(known_good={"k1", "k2", "k3", "n2"})
    book.failed("n1", "n2", g, "fail: low busbw")
    assert "n2" not in book.known_good and set(book.waiting) == {"n1", "n2"}
    idle = [("k1", other), ("n2", g), ("k2", g), ("k3", g)]
    assert book.partner_for("n1", idle, busy=set()) == "k2"  # k1: another placement; n2: its first partner
    assert book.partner_for("n1", idle, busy={"k2"}) == "k3"
    assert book.taken("n1", "k2").first_partner == "n2" and "n1" not in book.waiting
    book.back("n1")  # k2 could not be held: n1 waits again, and is not offered k2 again
    assert book.partner_for("n1", idle, busy=set()) == "k3"
    assert book.partner_for("n2", [("k1", other)], busy=set()) is None


def test_a_suspect_is_hopeless_only_with_no_partner_idle_and_no_pair_of_its_group_in_flight() -> None:
    g = ("p5", ())
    book = Repairs()
    book.failed("n1", "n2", g, "fail")
    assert book.hopeless("n1", [("n3", g)], in_flight=[])  # n3 idle but not known-good
    assert not book.hopeless("n1", [("n3", g)], in_flight=[g])  # a pair in flight may pass
    book.passed("n3", "n4")
    assert not book.hopeless("n1", [("n3", g)], in_flight=[])
    assert book.partner_for("n2", [("n3", g)], busy={"n3"}) is None  # busy now, idle later: not hopeless
    assert not book.hopeless("n2", [("n3", g)], in_flight=[])


def test_a_playbook_says_pair_true_or_false() -> None:
    actions = load_all()
    text = "name: p\n{}tasks:\n  - debug: {{msg: hi}}\n"
    assert parse_playbook(text.format("pair: true\n"), actions).pair is True
    assert parse_playbook(text.format(""), actions).pair is False
    with pytest.raises(PlaybookError, match="<playbook>:2: pair must be true or false"):
        parse_playbook(text.format("pair: yes please\n"), actions)


def test_choose_partner_takes_the_first_known_good_idle_node_of_the_group() -> None:
    from sweeper.pairing import choose_partner

    g, other = ("p5", ()), ("p4d", ())
    idle = [("a", other), ("b", g), ("c", g), ("d", g)]
    assert choose_partner("s", g, idle, known_good={"a", "c", "d"}, exclude=set()) == "c"
    assert choose_partner("s", g, idle, known_good={"a", "c", "d"}, exclude={"c"}) == "d"
    assert choose_partner("c", g, idle, known_good={"c"}, exclude=set()) is None


def test_a_dra_node_and_a_device_plugin_node_are_not_one_group() -> None:
    """One pair's pod template claims GPUs through DRA or requests nvidia.com/gpu, not both."""
    from sweeper.pairing import group_key
    labels = {"topology.k8s.aws/network-node-layer-3": "nn-1"}
    keys = ("topology.k8s.aws/network-node-layer-3",)
    assert group_key("p5", labels, keys) == group_key("p5", labels, keys, dra=False)
    assert group_key("p5", labels, keys, dra=True) != group_key("p5", labels, keys)
    assert group_key("p5", labels, keys, dra=True) == group_key("p5", dict(labels), keys, dra=True)
