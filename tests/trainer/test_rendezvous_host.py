"""Node 0 of a TrainJob hosts torchrun's rendezvous at its own address (fsdp_trainer/rendezvous_host.py).

The whole-cluster test (tests/e2e/test_trainjob.py) runs it with cluster DNS missing node 0's record.
"""

from __future__ import annotations

import pytest
from fsdp_api.contract import ENV_POD_IP
from fsdp_trainer.errors import ConfigError
from fsdp_trainer.rendezvous_host import hosted_here

ARGS = [
    "--nnodes=2",
    "--rdzv-backend=c10d",
    "--rdzv-endpoint=llama-node-0-0.llama:29400",
    "--rdzv-conf=join_timeout=1800,read_timeout=600",
    "-m",
    "fsdp_trainer",
]
NODE_0 = {"JOB_COMPLETION_INDEX": "0", ENV_POD_IP: "10.0.3.7"}


def test_node_0_hosts_at_its_pod_address_and_says_so() -> None:
    args, said = hosted_here(ARGS, "JOB_COMPLETION_INDEX=0", NODE_0)
    assert args == [
        "--nnodes=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.3.7:29400",
        "--rdzv-conf=join_timeout=1800,read_timeout=600,is_host=true",
        "-m",
        "fsdp_trainer",
    ]
    assert said == (
        "node 0 (JOB_COMPLETION_INDEX=0) hosts the rendezvous at its own address 10.0.3.7:29400; "
        "the other nodes reach it as llama-node-0-0.llama:29400"
    )


def test_the_other_nodes_keep_the_name() -> None:
    assert hosted_here(ARGS, "JOB_COMPLETION_INDEX=0", {**NODE_0, "JOB_COMPLETION_INDEX": "1"}) == (ARGS, None)
    assert hosted_here(ARGS, "JOB_COMPLETION_INDEX=0", {ENV_POD_IP: "10.0.3.7"}) == (ARGS, None)


def test_separate_flag_values_an_ipv6_address_and_an_explicit_is_host() -> None:
    args = ["--rdzv_endpoint", "h.s:29400", "--rdzv_conf", "is_host=false", "train.py"]
    out, _ = hosted_here(args, "JOB_COMPLETION_INDEX=0", {**NODE_0, ENV_POD_IP: "fd00::7"})
    assert out == ["--rdzv_endpoint", "[fd00::7]:29400", "--rdzv_conf", "is_host=true", "train.py"]
    # No --rdzv-conf: the option goes before the program, not after its arguments.
    out, _ = hosted_here(["--rdzv-endpoint=h.s:29400", "train.py", "--lr=1"], "JOB_COMPLETION_INDEX=0", NODE_0)
    assert out == ["--rdzv-conf=is_host=true", "--rdzv-endpoint=10.0.3.7:29400", "train.py", "--lr=1"]


def test_without_the_pod_address_nothing_changes_and_the_line_says_why() -> None:
    args, said = hosted_here(ARGS, "JOB_COMPLETION_INDEX=0", {"JOB_COMPLETION_INDEX": "0"})
    assert args == ARGS
    assert said == (
        f"JOB_COMPLETION_INDEX=0, but {ENV_POD_IP} is not set: torchrun looks up llama-node-0-0.llama:29400 "
        "to decide whether this pod hosts the rendezvous"
    )


def test_a_malformed_condition_is_one_config_error() -> None:
    with pytest.raises(ConfigError) as e:
        hosted_here(ARGS, "JOB_COMPLETION_INDEX", NODE_0)
    assert e.value.lines == ["--host-rendezvous-if: 'JOB_COMPLETION_INDEX' is not VAR=VALUE"]
