"""vagrant/: the multi-VM dev cluster (agents as services + SLURM) passes `vagrant validate`.

Boxes cannot be downloaded here and no hypervisor provider is installable, so validation
(with the provider blocks ignored) is the check; the provisioning script is checked to be
valid bash that installs files which exist in the repository.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VAGRANT_DIR = REPO / "vagrant"


@pytest.mark.parametrize("nodes", [2, 3])
def test_the_cluster_passes_vagrant_validate(nodes: int, tmp_path: Path) -> None:
    vagrant = shutil.which("vagrant")
    assert vagrant is not None, "vagrant is not installed: run vagrant/bootstrap.sh test"
    had_key_dir = (VAGRANT_DIR / ".cluster").exists()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "VAGRANT_HOME": str(tmp_path / ".vagrant.d"),
        "VAGRANT_DOTFILE_PATH": str(tmp_path / "dot"),  # keep the checkout clean
        "BPFDYNO_NODES": str(nodes),
    }
    r = subprocess.run([vagrant, "validate", "--ignore-provider"], cwd=VAGRANT_DIR, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Vagrantfile validated successfully." in r.stdout
    for i in range(1, nodes + 1):
        assert f"node{i}:" in r.stdout
    # Validation must not create the cluster's munge key (only `vagrant up` does).
    assert (VAGRANT_DIR / ".cluster").exists() == had_key_dir


def test_the_provisioning_script_installs_what_the_repository_has() -> None:
    script = VAGRANT_DIR / "cluster.sh"
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = script.read_text()
    paths = set(re.findall(r'"\$REPO/([\w./-]+)"', text))
    assert {"deploy/systemd/bpfdyno.service", "deploy/slurm/prolog.sh"} <= paths
    for rel in paths - {"vagrant/.cluster/munge.key", ".venv/bin/bpfdyno"}:
        assert (REPO / rel).is_file(), rel
    vagrantfile = (VAGRANT_DIR / "Vagrantfile").read_text()
    assert 'path: "cluster.sh"' in vagrantfile
