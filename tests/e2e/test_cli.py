"""Tier: the CLI contract — config file and flags, port already taken, clean SIGTERM."""
import subprocess

import pytest

from conftest import SLUICE_BIN, Broker, check_brokers
from kafka_wire import Conn, api_versions_v0


def test_refuses_a_port_that_is_taken(broker, tmp_path):
    r = subprocess.run([SLUICE_BIN, "serve", "--listen", broker.addr, "--data-dir", str(tmp_path / "other"),
                        "--cores", "1"], capture_output=True, timeout=30)
    assert r.returncode != 0
    assert b"cannot listen" in r.stderr
    c = Conn(broker.addr)
    assert api_versions_v0(c)[0] == 0


def test_config_file_with_flag_override(tmp_path):
    b = Broker(tmp_path / "d", cores=1)
    cfg = tmp_path / "sluice.toml"
    cfg.write_text(f'listen = "127.0.0.1:1"\nnode_id = 7\ndefault_partitions = 3\n'
                   f'data_dir = "{tmp_path / "ignored"}"\n')
    b.extra = ["--config", str(cfg)]  # --listen and --data-dir flags win over the file
    b.start()
    try:
        out = subprocess.run(["kcat", "-b", b.addr, "-L", "-t", "cfgtopic"], capture_output=True,
                             timeout=30).stdout.decode()
        assert f"broker 7 at {b.addr}" in out
        assert 'topic "cfgtopic" with 3 partitions' in out
        assert not (tmp_path / "ignored").exists()
    finally:
        check_brokers([b])  # still alive, stops with exit code 0, no ERROR in its log


def test_bad_config_is_refused(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("colour = 'blue'\n")
    r = subprocess.run([SLUICE_BIN, "serve", "--config", str(cfg)], capture_output=True, timeout=30)
    assert r.returncode != 0 and b"colour" in r.stderr


@pytest.mark.parametrize("flags,expect", [
    (["--controller-quorum", "1@127.0.0.1:1,1@127.0.0.1:2"], "listed twice"),
    (["--controller-quorum", "1@127.0.0.1:1", "--controller-listen", "127.0.0.1:1",
      "--process-roles", "broker"], "lists this node (1) as a voter"),
    (["--controller-quorum", "2@127.0.0.1:1,3@127.0.0.1:2"], "on a node that joins"),
    (["--controller-quorum", "1@127.0.0.1:1,2@127.0.0.1:2"], "--controller-listen is required"),
    (["--controller-quorum", "one@127.0.0.1:1"], "bad node id"),
    (["--broker-session-timeout-ms", "1000", "--broker-heartbeat-interval-ms", "800"],
     "at most half"),
    (["--node-id", "0"], "at least 1"),
])
def test_bad_cluster_flags_are_refused_clearly(tmp_path, flags, expect):
    r = subprocess.run([SLUICE_BIN, "serve", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0",
                        *flags], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0, r.stdout
    assert expect in r.stderr, r.stderr
    # Nothing was created: a refused start touches no data.
    assert not (tmp_path / "__cluster_metadata").exists()


def sluice_cluster_describe(addr, *extra):
    return subprocess.run([SLUICE_BIN, "cluster", "describe", "--bootstrap-server", addr, *extra],
                          capture_output=True, text=True, timeout=60)


def test_cluster_describe_single_broker(broker):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": broker.addr})
    admin.create_topics([NewTopic("described", 2, 1)])["described"].result(timeout=30)
    r = sluice_cluster_describe(broker.addr)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    controller = int(next(ln for ln in lines if ln.startswith("Controller: ")).split()[1])
    brokers = lines[lines.index("Brokers (1):") + 2].split()
    assert brokers[:3] == [str(controller), broker.addr, "-"] and "controller" in brokers[3], r.stdout
    rows = [ln.split() for ln in lines if ln.startswith("  described ")]
    # TOPIC PARTITION LEADER EPOCH REPLICAS ISR OFFLINE-REPLICAS ERROR, listed once.
    assert [(r_[1], r_[2], r_[4], r_[5], r_[6], r_[7]) for r_ in rows] == \
        [(str(p), str(controller), str(controller), str(controller), "-", "-") for p in (0, 1)], r.stdout
    assert all(int(r_[3]) >= 0 for r_ in rows)
    assert "Under-replicated partitions (0):\n  (none)" in r.stdout
    assert "Offline partitions (0):\n  (none)" in r.stdout
    # --exclude-internal leaves internal topics (__consumer_offsets, once it exists) out.
    assert "__consumer_offsets" not in sluice_cluster_describe(broker.addr, "--exclude-internal").stdout


def test_cluster_describe_unreachable_broker_fails_clearly():
    from conftest import free_port
    addr = f"127.0.0.1:{free_port()}"  # nothing listens there
    r = sluice_cluster_describe(addr)
    assert r.returncode != 0
    assert r.stdout == ""
    assert f"sluice cluster: cannot reach broker at {addr}" in r.stderr, r.stderr
