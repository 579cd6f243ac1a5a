"""What evaluation and the commands must know about an eviction method beyond its press, by name: plain data.

Each method's part in an evaluation (the reference, the upper bound, what trained part it needs, whether it
evicts, whether it ranks) lives here rather than as string checks in the callers. It is kept apart from the
registry of presses (:mod:`lkv.eviction.registry`, which imports torch and transformers) so that reading and
comparing result rows (:mod:`lkv.eval.results`, :mod:`lkv.eval.paired`) loads no model code.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Literal

from lkv.eviction.names import MethodName

Role = Literal["method", "reference", "upper bound"]
Requirement = Literal["", "adapter", "probe", "restore"]


@dataclass(frozen=True)
class Roles:
    """A method's part in an evaluation, beside its press.

    Attributes:
        role: ``method``; ``reference`` (FullKV: evicts nothing, its answer is what every method is compared
            with, its rows carry no budget); ``upper bound`` (the Oracle: scored from the reference's own
            answer, so its scores come from the answer, not from a press on the prompt).
        requires: what the method needs beside the model: ``adapter`` (a trained lookahead module; every
            ``<name>:<module>`` of it, e.g. ``lookaheadkv:s1`` of ``lkv eval --adapters``, is the same method on
            another module), ``probe``, ``restore`` (a trained RestoreKV folder, ``press_args``' ``folder``),
            or nothing.
        evicts: False for a method that keeps the whole cache (FullKV, Quest): no baseline to beat.
        unranked: why the importance task has no ranking of the method to score ("": it has one).
    """

    role: Role = "method"
    requires: Requirement = ""
    evicts: bool = True
    unranked: str = ""


ROLES: dict[MethodName, Roles] = {
    "fullkv": Roles("reference", evicts=False, unranked="keeps everything"),
    "oracle": Roles("upper bound", unranked="is the ground truth itself"),
    "lookaheadkv": Roles(requires="adapter"),
    "probe": Roles(requires="probe"),
    "pyramidkv": Roles(unranked="ranks like SnapKV (only its per-layer budgets differ)"),
    "restorekv": Roles(requires="restore"),
    "quest": Roles(
        evicts=False, unranked="evicts nothing (it selects pages of the full cache at every decoding step)"
    ),
}
"""The registered methods whose roles differ from a plain method's (``Roles()``), by registered name."""


def _only(**roles: object) -> str:
    (name,) = (name for name, r in ROLES.items() if all(getattr(r, k) == v for k, v in roles.items()))
    return name


REFERENCE = _only(role="reference")
"""The reference method's name (FullKV's ``fullkv``): the answer every method is compared with."""
UPPER_BOUND = _only(role="upper bound")
"""The upper bound's name (the Oracle's ``oracle``): scored from the reference's answer."""
ADAPTER_METHOD = _only(requires="adapter")
"""The method of a trained lookahead module (``lookaheadkv``); ``lookaheadkv:<name>`` names another module."""
PROBE_METHOD = _only(requires="probe")
"""The method of a trained per-token probe (``probe``)."""
RESTORE_METHOD = _only(requires="restore")
"""The method of a trained RestoreKV module (``restorekv``), built on the loaded model from ``press_args``."""


def registered_name(name: str, names: Container[str]) -> str | None:
    """The name in ``names`` (registered names) that ``name`` evaluates: ``name`` itself or the ``<name>`` of
    ``<name>:<entry>``, case-insensitive; None if neither is there."""
    name = name.lower()
    if name in names:
        return name
    base = name.partition(":")[0]
    return base if ":" in name and base in names else None


def roles_of(name: str) -> Roles:
    """The :class:`Roles` of the method evaluated as ``name``: a registered name, ``<name>:<entry>`` (another
    trained module of a registered method, e.g. ``lookaheadkv:s1``, or the method at other settings, e.g.
    ``snapkv:w64``), or any other name (a press evaluated under a name of its own: a plain method)."""
    registered = registered_name(name, ROLES)
    return Roles() if registered is None else ROLES[registered]
