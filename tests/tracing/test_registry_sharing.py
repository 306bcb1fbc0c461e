"""The trainer registry is shared out per user: users who fill it between them make room for
the next user's trainer, and a user's subordinate uids (rootless containers) are that user.

The registry is driven directly here with the kernel's credentials as the endpoint passes
them; `test_attacks.py` does the same with real users' sockets against a real agent.
"""

from __future__ import annotations

from pathlib import Path

from bpfdyno.core.identity import Principals
from bpfdyno.tracing.ipc.wire import KinetoRequest
from bpfdyno.tracing.trainers import TrainerRegistry

IDLE = 3
NOW = (1_800_000_000.0, 1000.0)


def poll(reg: TrainerRegistry, address: str, uid: int) -> bool:
    """One poll of a trainer of ``uid`` at ``address``; whether it is registered."""
    req = KinetoRequest(IDLE, 0, (uid,))
    return reg.observe(address.encode(), req, *NOW, uid=uid, host_pid=uid) is not None


def test_users_who_fill_it_make_room_for_the_next_user() -> None:
    reg = TrainerRegistry(max_entries=8, max_per_uid=4)
    for attacker in (2001, 2002):
        for i in range(4):
            assert poll(reg, f"{attacker}-{i}", attacker)
    assert len(reg) == 8
    # Every entry is live (polled just now): a newcomer takes the place of the most recently
    # registered trainer of the users holding the most.
    assert poll(reg, "alice", 1001)
    assert reg.get(b"2002-3") is None and reg.stats.displaced == 1
    # The displaced ones come back again and again: they displace each other, never alice.
    for round_ in range(10):
        gone = next(a for a in (f"{u}-{i}" for u in (2001, 2002) for i in range(4)) if
                    reg.get(a.encode()) is None)  # fmt: skip
        assert poll(reg, gone, int(gone[:4])), round_
        assert reg.get(b"alice") is not None
    assert reg.stats.displaced == 11 and reg.stats.refused_full == 0
    # A second trainer of alice's still fits (she holds 1, they 3 or 4); when she holds as
    # many as the most, nobody gives way to her.
    assert poll(reg, "alice-2", 1001) and poll(reg, "alice-3", 1001)
    held = {uid: sum(t.uid == uid for t in reg.trainers()) for uid in (1001, 2001, 2002)}
    assert held[1001] == 3 and sorted(held.values()) == [2, 3, 3]
    assert not poll(reg, "alice-4", 1001)
    assert reg.stats.refused_full == 1


def test_root_and_unknown_owners_are_never_displaced() -> None:
    reg = TrainerRegistry(max_entries=2, max_per_uid=4)
    assert poll(reg, "root", 0)
    assert reg.observe(b"nobody-knows", KinetoRequest(IDLE, 0, (7,)), *NOW) is not None
    assert not poll(reg, "alice", 1001)
    assert reg.stats.refused_full == 1 and len(reg) == 2


def test_subordinate_uids_are_their_users(tmp_path: Path) -> None:
    """A rootless container runs as thousands of host uids; they are one user's quota."""
    subuid = tmp_path / "subuid"
    subuid.write_text("2001:200000:65536\nnobody:300000:10\n")
    reg = TrainerRegistry(max_entries=100, max_per_uid=3, principals=Principals(subuid))
    assert [poll(reg, f"c{i}", 200000 + i) for i in range(5)] == [True, True, True, False, False]
    assert not poll(reg, "own", 2001)  # the user's own uid shares the quota
    assert reg.stats.refused_uid_quota == 3
    assert poll(reg, "other", 1001)
    assert Principals(subuid).of(300005) == 65534  # names are looked up
    subuid.write_text("")  # the file is read again when it changes
    assert poll(reg, "c5", 200005)
