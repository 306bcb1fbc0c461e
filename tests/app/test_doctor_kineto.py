"""`doctor`'s answer to "who can configure trainers here without the agent?"."""

from __future__ import annotations

import pytest

from bpfdyno.app.doctor import check_kineto_protection
from bpfdyno.core.config import Config

pytestmark = pytest.mark.root  # the kernel guard is loaded to see whether the kernel takes it


def _cfg(socket_dir: str = "", guard: bool = True, root: str = "") -> Config:
    cfg = Config()
    cfg.kineto.socket_dir = socket_dir
    cfg.kineto.kernel_guard = guard
    cfg.kineto.user_socket_root = root
    return cfg


def test_abstract_names_under_the_kernel_guard_are_protected() -> None:
    c = check_kineto_protection(_cfg())
    assert (c.ok, c.detail) == (True, "kernel guard of abstract names")


def test_open_layouts_are_named_with_the_fix() -> None:
    c = check_kineto_protection(_cfg(guard=False))
    assert c.ok is None and not c.required
    assert c.detail.startswith("trainers on the abstract names can be configured by any local")
    assert 'set [kineto] user_socket_root = "/run/bpfdyno/kineto"' in c.fix
    c = check_kineto_protection(_cfg(socket_dir="/run/bpfdyno/kineto", root="/run/bpfdyno/u"))
    assert c.detail.startswith(
        "trainers on the shared directory /run/bpfdyno/kineto can be configured by any local "
        "user, bypassing the agent (kernel guard of abstract names, per-user directories under "
        "/run/bpfdyno/u for the others)"
    )
    assert c.fix == "start jobs with `bpfdyno run` (their user's own directory)"


def test_the_per_pod_layout_of_a_daemonset_is_named_with_its_fix() -> None:
    cfg = _cfg(socket_dir="/run/bpfdyno/kineto")
    cfg.kineto.pod_socket_root = "/run/bpfdyno/pods"
    c = check_kineto_protection(cfg)
    assert c.detail.startswith(
        "trainers on the shared directory /run/bpfdyno/kineto can be configured by any local "
        "user, bypassing the agent (kernel guard of abstract names, per-pod directories under "
        "/run/bpfdyno/pods for the others)"
    )
    assert c.fix == (
        "mount each trainer pod's own directory under the per-pod root "
        "(deploy/kubernetes/trainer-example.yaml)"
    )
