"""The pids a Kineto poll claims, checked against the kernel's credentials of its sender.

A fake /proc tree stands in for processes in several pid namespaces; the real kernel path
(SO_PASSCRED on the endpoint, SCM_CREDENTIALS per datagram) is covered by test_ipc and the
unprivileged-user tests in test_security.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bpfdyno.tracing.ipc.sender import ClaimVerifier, SenderCreds

ALICE = 51001


def proc(root: Path, pid: int, ppid: int, nspids: tuple[int, ...]) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    ns = "\t".join(str(p) for p in nspids)
    (d / "status").write_text(f"Name:\tpython\nPid:\t{pid}\nPPid:\t{ppid}\nNSpid:\t{ns}\n")


@pytest.fixture
def tree(tmp_path: Path) -> ClaimVerifier:
    # Host: 100 (launcher) -> 200 (trainer); a container: 300 (its pid 1) -> 310 (its 7).
    proc(tmp_path, 100, 1, (100,))
    proc(tmp_path, 200, 100, (200,))
    proc(tmp_path, 300, 50, (300, 1))
    proc(tmp_path, 310, 300, (310, 7))
    proc(tmp_path, 50, 1, (50,))
    return ClaimVerifier(tmp_path)


def test_own_pid_and_real_ancestors_are_confirmed(tree: ClaimVerifier) -> None:
    assert tree.verify(SenderCreds(200, ALICE, ALICE), (200, 100)) == (200, 100)


def test_someone_elses_pid_is_refused(tree: ClaimVerifier) -> None:
    """The issue's impersonation: a user's poll claiming a root trainer's pid."""
    assert tree.verify(SenderCreds(200, ALICE, ALICE), (4242,)) is None
    assert tree.verify(SenderCreds(200, ALICE, ALICE), (100, 1)) is None


def test_invented_ancestors_are_dropped(tree: ClaimVerifier) -> None:
    # 200 claims root's launcher 9999 as its parent: only what /proc confirms is kept.
    assert tree.verify(SenderCreds(200, ALICE, ALICE), (200, 9999, 100)) == (200,)
    assert tree.verify(SenderCreds(200, ALICE, ALICE), (200, 100, 9999)) == (200, 100)


def test_pid_namespace_of_a_container(tree: ClaimVerifier) -> None:
    # Host pid 310 is pid 7 in its namespace, its parent is that namespace's pid 1.
    assert tree.verify(SenderCreds(310, ALICE, ALICE), (7, 1)) == (7, 1)
    assert tree.verify(SenderCreds(310, ALICE, ALICE), (310,)) is None  # not its own view
    assert tree.verify(SenderCreds(310, ALICE, ALICE), (8,)) is None
    # Even root inside a container must tell the truth: it cannot claim the host's pids.
    assert tree.verify(SenderCreds(310, 0, 0), (200,)) is None
    # The container's pid 1 has its parent outside the namespace: no ancestor to confirm.
    assert tree.verify(SenderCreds(300, ALICE, ALICE), (1, 50)) == (1,)


def test_root_in_the_agents_namespace_is_trusted(tree: ClaimVerifier) -> None:
    assert tree.verify(SenderCreds(200, 0, 0), (8100, 8000)) == (8100, 8000)


def test_a_sender_that_is_gone_is_refused(tree: ClaimVerifier) -> None:
    assert tree.verify(SenderCreds(999, ALICE, ALICE), (999,)) is None


def test_verdicts_are_cached(tree: ClaimVerifier, tmp_path: Path) -> None:
    creds = SenderCreds(200, ALICE, ALICE)
    assert tree.verify(creds, (200, 100)) == (200, 100)
    (tmp_path / "200" / "status").unlink()  # /proc is not read again for the same claim
    assert tree.verify(creds, (200, 100)) == (200, 100)
    assert tree.verify(creds, (200,)) is None  # a new claim is checked afresh


def test_the_host_pid_comes_from_the_kernel_not_the_claim(tree: ClaimVerifier) -> None:
    """Every later step (capture, NCCL probes, GPU processes, /proc/<pid>/root) uses the
    process's pid here: the kernel's, whatever the container's process says."""
    assert tree.resolve(SenderCreds(310, ALICE, ALICE), (7, 1)) == ((7, 1), 310, True)
    assert tree.resolve(SenderCreds(300, 0, 0), (1,)) == ((1,), 300, True)  # root in a container
    assert tree.resolve(SenderCreds(200, ALICE, ALICE), (200, 100)) == ((200, 100), 200, True)
    # Root in the agent's own namespace speaking for another pid (a simulator): a pid here.
    assert tree.resolve(SenderCreds(200, 0, 0), (8100, 8000)) == ((8100, 8000), 8100, True)
    assert tree.resolve(SenderCreds(310, ALICE, ALICE), (8,)) == (None, 310, True)


def test_a_sender_proc_does_not_show_is_refused_as_unresolved(tree: ClaimVerifier) -> None:
    assert tree.resolve(SenderCreds(999, ALICE, ALICE), (999,)) == (None, 999, False)


def test_polls_of_a_sender_proc_does_not_show_are_refused_with_that_reason(
    tree: ClaimVerifier, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from bpfdyno.services.tracing import TracingService
    from bpfdyno.tracing.ipc.wire import KinetoRequest
    from bpfdyno.tracing.trainers import TrainerRegistry

    svc = TracingService([str(tmp_path)], 60.0, TrainerRegistry(), proc_root=tmp_path)
    req = KinetoRequest(config_type=3, job_id=0, pids=(999,))
    for _ in range(3):
        assert svc.on_request(b"\0c", req, SenderCreds(999, ALICE, ALICE)) == ""
    assert (svc.unresolved, svc.false_claims, len(svc.registry)) == ({ALICE: 3}, {}, 0)
    assert "rule 'sender_unresolved'" in caplog.text and "sender pid 999" in caplog.text
    # A sender /proc shows, claiming someone else's pid: the other rule.
    assert svc.on_request(b"\0d", req, SenderCreds(200, ALICE, ALICE)) == ""
    assert svc.false_claims == {ALICE: 1}
