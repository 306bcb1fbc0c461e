"""When a command works on a whole job, and which port its agents listen on."""

from __future__ import annotations

from pathlib import Path

import pytest

from bpfdyno.cli.cluster import ClusterUsageError, agent_port, cluster_requested, resolve_cluster
from bpfdyno.cli.main import build_parser, main


def args(*argv: str) -> object:
    return build_parser().parse_args(["gputrace", "--log-file", "/tmp/x.json", *argv])


@pytest.fixture(autouse=True)
def no_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BPFDYNO_TARGET", raising=False)


@pytest.mark.parametrize(
    ("argv", "whole_job"),
    [
        ((), False),  # dyno's default: job 0, the local agent
        (("--job-id", "0"), False),
        (("--job-id", "1234"), True),
        (("--job-id", "1234_5"), True),
        (("--job-id", "1234", "--host", "node1:50051"), False),  # one agent, as before
        (("--job-id", "1234", "--socket", "/run/x.sock"), False),
        (("--hosts", "n1,n2"), True),
        (("--hosts-file", "/tmp/hosts"), True),
    ],
)
def test_a_job_id_without_a_target_means_the_whole_job(
    argv: tuple[str, ...], whole_job: bool
) -> None:
    assert cluster_requested(args(*argv)) is whole_job


def test_a_pinned_target_keeps_one_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BPFDYNO_TARGET", "/run/x.sock")
    assert not cluster_requested(args("--job-id", "1234"))


def test_the_agents_port_from_the_flag_the_config_or_the_default(tmp_path: Path) -> None:
    assert agent_port(args("--port", "7000")) == 7000
    config = tmp_path / "bpfdyno.toml"
    config.write_text(
        '[grpc]\ntcp = "0.0.0.0:50999"\ninsecure_tcp = true\n'  # a cluster's agent config
    )
    assert agent_port(args("--config", str(config))) == 50999
    assert agent_port(args("--config", str(config), "--port", "7000")) == 7000
    (tmp_path / "plain.toml").write_text("")
    assert agent_port(args("--config", str(tmp_path / "plain.toml"))) == 50051
    with pytest.raises(ClusterUsageError, match=r"--port 70000: give a port in 1\.\.65535"):
        agent_port(args("--port", "70000"))
    (tmp_path / "bad.toml").write_text("[grpc]\ntcp = 5\n")
    with pytest.raises(ClusterUsageError, match="cannot take the agents' port from the config"):
        agent_port(args("--config", str(tmp_path / "bad.toml")))


def test_conflicting_or_impossible_options_are_refused_with_what_to_write(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ClusterUsageError, match="give one or the other"):
        resolve_cluster(args("--hosts", "n1", "--host", "n2:1"))
    with pytest.raises(ClusterUsageError, match=r"squeue -h -j 1234_5 -o %A"):
        resolve_cluster(args("--hosts", "n1", "--job-id", "1234_5"))
    with pytest.raises(ClusterUsageError, match="not a SLURM job id"):
        resolve_cluster(args("--job-id", "12-x"))
    # pids are per machine; one agent cannot take an array task's id.
    assert main(["gputrace", "--hosts", "n1", "--pids", "12", "--log-file", "/tmp/x"]) == 2
    assert "--pids are per machine" in capsys.readouterr().err
    argv = ["gputrace", "--host", "n1:1", "--job-id", "12_3", "--log-file", "/tmp/x.json"]
    assert main(argv) == 2
    assert "one agent (--host) matches the numeric $SLURM_JOB_ID" in capsys.readouterr().err
    assert main(["top", "--hosts", "n1,bad/host"]) == 2
    assert "'bad/host' is not a host" in capsys.readouterr().err


def test_the_agents_port_needs_no_access_to_the_agents_secrets(tmp_path: Path) -> None:
    # A node's config names TLS and token files only root may read; a user's gputrace needs
    # just the port from it.
    config = tmp_path / "bpfdyno.toml"
    config.write_text(
        '[grpc]\ntcp = "0.0.0.0:50998"\ntls_cert = "/nonexistent/cert.pem"\n'
        'tls_key = "/nonexistent/key.pem"\ntoken_file = "/nonexistent/token"\n'
    )
    assert agent_port(args("--config", str(config))) == 50998
    (tmp_path / "noport.toml").write_text('[grpc]\ntcp = "somewhere"\n')
    with pytest.raises(ClusterUsageError, match=r"\[grpc\] tcp = 'somewhere' is not host:port"):
        agent_port(args("--config", str(tmp_path / "noport.toml")))
