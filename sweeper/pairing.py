"""Pair sweeps, the pure part: which nodes may share a pair (one profile, one network placement),
forming pairs from the due nodes, choosing a known-good partner for a suspect, what a pair run's
result means for each of its two nodes, and the run's re-pair bookkeeping."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sweeper.policy import HOLDING

T = TypeVar("T")
GroupKey = tuple[str, tuple[str | None, ...]]


def group_key(profile: str, labels: Mapping[str, str], pair_labels: Sequence[str], dra: bool = False) -> GroupKey:
    """Two nodes may be paired when their keys are equal: the same profile, the same value of each of
    `pair_labels` (a label absent on both counts as equal; present on one only does not), and the same
    way of publishing their GPUs (a DRA node's pod claims them, a device plugin node's requests
    nvidia.com/gpu: one pair's pod template cannot do both)."""
    return profile + (" (DRA)" if dra else ""), tuple(labels.get(k) for k in pair_labels)


def pair_status(verdict: str) -> str:
    """The pair result's status from the play's verdict: a holding verdict is a failed pair."""
    return "fail" if verdict in HOLDING else verdict if verdict in ("pass", "warn", "error") else "inconclusive"


def form_pairs(items: Iterable[T], key: Callable[[T], GroupKey], room: int) -> list[tuple[T, T]]:
    """Pairs of items of one group, in the order given (the due order), at most room // 2 of them:
    each item waits for the next item of its group; an odd item of a group is left out."""
    waiting: dict[GroupKey, T] = {}
    out: list[tuple[T, T]] = []
    for item in items:
        if len(out) >= room // 2:
            break
        k = key(item)
        if k in waiting:
            out.append((waiting.pop(k), item))
        else:
            waiting[k] = item
    return out


def choose_partner(node: str, group: GroupKey, idle: Sequence[tuple[str, GroupKey]], known_good: set[str],
                   exclude: set[str]) -> str | None:
    """The first idle known-good node of the group, other than `node` and those excluded."""
    return next((name for name, key in idle
                 if key == group and name in known_good and name != node and name not in exclude), None)


@dataclass(frozen=True)
class NodeCall:
    """What a pair run decides for one of its two nodes."""

    node: str
    verdict: str
    reasons: tuple[str, ...]
    suspect: bool = False  # stays held, waiting for a re-pair with a known-good partner
    rules: tuple[str, ...] = ()  # the policy's pair rules that decided it, where they did


def partner_only(mode: str, partner: str, verdict: str, hosts: Collection[str]) -> bool:
    """A re-pair (mode "repair") failed on its known-good partner's own word alone: every finding
    that is not a pass (`hosts`: the nodes whose own logs, probes or pods gave them) came from the
    partner, none from the suspect's own log. A node taken over prints its own log, so that log
    may blame only the node it ran on."""
    return mode == "repair" and verdict in HOLDING and bool(hosts) and set(hosts) == {partner}


def node_verdicts(mode: str, node: str, partner: str, verdict: str, reasons: Sequence[str],
                  hosts: Collection[str] = (), repairs: bool = True) -> tuple[NodeCall, NodeCall]:
    """Each node's verdict from the pair play's verdict. A failed pair in mode "sweep" blames no one:
    both become suspects. In mode "repair" (`node` the suspect, `partner` known-good) a failure is
    the suspect's, and its known-good partner goes back inconclusive; unless it failed on the
    partner's own log alone (`partner_only`): then it blames no one either, and both become
    suspects (the partner is known-good no more), or, where the run re-pairs no one (`repairs`
    false: a claim's pair), both go back inconclusive."""
    why = "; ".join(reasons)
    if verdict in ("pass", "warn"):
        return NodeCall(node, verdict, tuple(reasons)), NodeCall(partner, verdict, tuple(reasons))
    if verdict not in HOLDING:  # error: a fault of the tool; inconclusive: raced, stopped, never scheduled
        return NodeCall(node, verdict, tuple(reasons)), NodeCall(partner, verdict, tuple(reasons))
    if partner_only(mode, partner, verdict, hosts):
        said = (f"re-pair with known-good {partner} failed on {partner}'s own log alone ({why}); {node}'s own "
                "log shows no fault")
        then = "; re-pairing both with known-good partners" if repairs else ""
        return (NodeCall(node, "inconclusive", (f"{said}: {node} is not blamed{then}",), suspect=repairs),
                NodeCall(partner, "inconclusive", (f"{said}: {partner} is known-good no more{then}",),
                         suspect=repairs))
    if mode == "sweep":
        return (NodeCall(node, "inconclusive", (f"pair with {partner} failed: {why}; re-pairing with a known-good "
                                                "partner",), suspect=True),
                NodeCall(partner, "inconclusive", (f"pair with {node} failed: {why}; re-pairing with a known-good "
                                                   "partner",), suspect=True))
    return (NodeCall(node, verdict, tuple(reasons) + (f"failed again with known-good partner {partner}",)),
            NodeCall(partner, "inconclusive", (f"failed with suspect {node}",)))


@dataclass
class Suspect:
    node: str
    first_partner: str
    group: GroupKey
    why: str


@dataclass
class Repairs:
    """A run's re-pair bookkeeping: the known-good nodes (from the history, plus this run's passes)
    and the suspects of failed pairs, held while a known-good partner is found."""

    known_good: set[str] = field(default_factory=set)
    waiting: dict[str, Suspect] = field(default_factory=dict)
    tried: dict[str, set[str]] = field(default_factory=dict)  # suspect -> partners it was re-paired with
    out: dict[str, Suspect] = field(default_factory=dict)  # suspects in a re-pair now
    earlier: dict[str, str] = field(default_factory=dict)  # an earlier run's suspects, let go -> first partner

    def passed(self, *nodes: str) -> None:
        self.known_good.update(nodes)

    def failed(self, a: str, b: str, group: GroupKey, why: str) -> None:
        """A pair of mode "sweep" failed: both wait for a re-pair; neither is known-good now."""
        self.suspect(a, b, group, why)
        self.suspect(b, a, group, why)

    def suspect(self, node: str, first_partner: str, group: GroupKey, why: str) -> None:
        """`node` waits for a re-pair; it is not known-good now, and never re-paired with its first partner."""
        self.known_good.discard(node)
        self.waiting[node] = Suspect(node, first_partner, group, why)
        self.tried.setdefault(node, set()).add(first_partner)

    def partner_for(self, suspect: str, idle: Sequence[tuple[str, GroupKey]], busy: set[str]) -> str | None:
        """The first idle known-good node of the suspect's group that is not busy, not a suspect and
        not a partner the suspect already had; None if there is none."""
        s = self.waiting[suspect]
        return choose_partner(suspect, s.group, idle, self.known_good,
                              busy | set(self.waiting) | self.tried.get(suspect, set()))

    def hopeless(self, suspect: str, idle: Sequence[tuple[str, GroupKey]], in_flight: Iterable[GroupKey]) -> bool:
        """No known-good partner can come this run: none idle in the group, and no pair of the group
        in flight that might pass."""
        s = self.waiting[suspect]
        return s.group not in set(in_flight) and self.partner_for(suspect, idle, set()) is None

    def taken(self, suspect: str, partner: str) -> Suspect:
        """The suspect leaves the waiting list for a re-pair with `partner`."""
        self.tried.setdefault(suspect, set()).add(partner)
        self.out[suspect] = self.waiting.pop(suspect)
        return self.out[suspect]

    def back(self, suspect: str) -> None:
        """Its re-pair was abandoned before it ran (the partner could not be held): it waits again."""
        self.waiting[suspect] = self.out.pop(suspect)

    def settled(self, suspect: str) -> None:
        """Its re-pair ran: the suspect has its verdict."""
        self.out.pop(suspect, None)
