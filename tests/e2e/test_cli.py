"""Tier: the CLI contract — config file and flags, port already taken, clean SIGTERM."""
import subprocess

from conftest import SLUICE_BIN, Broker
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
        assert b.stop() == 0


def test_bad_config_is_refused(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("colour = 'blue'\n")
    r = subprocess.run([SLUICE_BIN, "serve", "--config", str(cfg)], capture_output=True, timeout=30)
    assert r.returncode != 0 and b"colour" in r.stderr
