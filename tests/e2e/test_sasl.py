"""Tier: SASL on the Kafka listener (issue 42): `--security-protocol SASL_PLAINTEXT` and
`SASL_SSL` with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512.

Users are SCRAM credentials in the metadata quorum: the bootstrap user from
SLUICE_SASL_BOOTSTRAP_USER, the rest made with `sluice user add` or a client's
AlterUserScramCredentials. Real clients at their defaults plus the SASL settings a user
gives them: confluent-kafka (librdkafka), kafka-python and kcat; the protocol's corners
(v0 handshakes, requests before authentication, the failure budget) over raw sockets.
"""
import os
import random
import socket
import struct
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, NewTopic, ScramCredentialInfo, ScramMechanism,
                                   UserScramCredentialDeletion, UserScramCredentialUpsertion)

from cluster import Cluster, _call, metadata_from, sasl_plain_login
from conftest import SLUICE_BIN, wait_until
from test_tls import certs, ssl_flags  # noqa: F401 (the certificates fixture)

ADMIN = ("admin", "admin-secret")
BOOTSTRAP_ENV = {"SLUICE_SASL_BOOTSTRAP_USER": f"{ADMIN[0]}:{ADMIN[1]}"}
ALL_MECHANISMS = "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"


def sasl_flags(protocol="SASL_PLAINTEXT", mechanisms=ALL_MECHANISMS):
    return ["--security-protocol", protocol, "--sasl-enabled-mechanisms", mechanisms]


def sasl_broker(make_broker, cores=1, extra=()):
    return make_broker(cores=cores, extra=sasl_flags() + list(extra), env=BOOTSTRAP_ENV)


def conf(addr, user=ADMIN[0], password=ADMIN[1], mechanism="SCRAM-SHA-256", protocol="sasl_plaintext"):
    return {"bootstrap.servers": addr, "security.protocol": protocol, "sasl.mechanisms": mechanism,
            "sasl.username": user, "sasl.password": password}


def produce(c, topic, n, timeout=30, prefix="v"):
    """Produces `n` records at the client's defaults (acks=all, idempotence); returns
    how many were acknowledged and the errors of the rest."""
    p = Producer(dict(c, **{"message.timeout.ms": timeout * 1000}))
    acked, errors = [], []
    for i in range(n):
        p.produce(topic, value=f"{prefix}{i}".encode(),
                  on_delivery=lambda e, m: (errors if e else acked).append(e or m.offset()))
    left = p.flush(timeout + 10)
    assert left == 0, f"{left} records neither acknowledged nor failed"
    return len(acked), errors


def consume_all(c, topic, n, timeout=30):
    cons = Consumer(dict(c, **{"group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}))
    cons.subscribe([topic])
    got, errors = [], []

    def more():
        m = cons.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
        elif m is not None:
            errors.append(str(m.error()))
        assert len(errors) < 50, errors[-5:]
        return len(got) >= n

    try:
        wait_until(more, timeout=timeout, interval=0, what=f"{n} records over SASL")
    finally:
        cons.close()
    return got


def log_end(c, topic):
    cons = Consumer(dict(c, **{"group.id": "watermarks"}))
    try:
        return cons.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        cons.close()


def create(c, topic, partitions=1, rf=1):
    a = AdminClient(c)
    a.create_topics([NewTopic(topic, partitions, rf)])[topic].result(30)


def command_config(tmp_path, user=ADMIN[0], password=ADMIN[1], mechanism="SCRAM-SHA-512", extra=""):
    p = tmp_path / f"client-{uuid.uuid4().hex[:6]}.properties"
    p.write_text(f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism={mechanism}\n"
                 f"sasl.username={user}\nsasl.password={password}\n{extra}")
    return str(p)


def sluice(*args, input=None):
    return subprocess.run([SLUICE_BIN, *args], input=input, capture_output=True, text=True, timeout=60)


def raw(addr, source=None):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10,
                                 source_address=(source, 0) if source else None)
    s.settimeout(10)
    return s


def closed(s):
    """Whether the broker closed `s` (EOF or a reset) within its timeout."""
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_clients_log_in_with_every_mechanism(make_broker, tmp_path):
    """The bootstrap user exists at start; `sluice user add` makes another; confluent-kafka
    (all three mechanisms), kafka-python (SCRAM-SHA-256, PLAIN) and kcat (SCRAM-SHA-512)
    produce and consume as it, a consumer group included. A wrong password, an unknown
    user and a client without SASL write nothing, and each refusal is in the audit log."""
    b = sasl_broker(make_broker, cores=2)
    admin_cfg = command_config(tmp_path)
    r = sluice("user", "add", "alice", "--bootstrap", b.addr, "--command-config", admin_cfg,
               input="alice-pw\n")
    assert r.returncode == 0, r.stderr
    r = sluice("user", "list", "--bootstrap", b.addr, "--command-config", admin_cfg)
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:]}
    assert set(lines) == {"admin", "alice"}, r.stdout
    assert "SCRAM-SHA-256 (4096 iterations), SCRAM-SHA-512 (4096 iterations)" in lines["alice"]

    alice = lambda m: conf(b.addr, "alice", "alice-pw", mechanism=m)  # noqa: E731
    create(alice("SCRAM-SHA-256"), "t")
    for m in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
        assert produce(alice(m), "t", 100, prefix=m) == (100, []), m
    got = consume_all(alice("SCRAM-SHA-512"), "t", 300)
    assert len(got) == 300 and sum(v.startswith(b"PLAIN") for v in got) == 100

    from kafka import KafkaConsumer, KafkaProducer
    for m in ("SCRAM-SHA-256", "PLAIN"):
        kp = KafkaProducer(bootstrap_servers=b.addr, security_protocol="SASL_PLAINTEXT", sasl_mechanism=m,
                           sasl_plain_username="alice", sasl_plain_password="alice-pw")
        for i in range(50):
            kp.send("t", value=f"kp-{m}-{i}".encode())
        kp.flush(30)
        kp.close()
    kc = KafkaConsumer("t", bootstrap_servers=b.addr, security_protocol="SASL_PLAINTEXT",
                       sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice",
                       sasl_plain_password="alice-pw", auto_offset_reset="earliest",
                       group_id="kp-group", consumer_timeout_ms=15000)
    seen = [m.value for m in kc]
    kc.close()
    assert len(seen) == 400 and sum(v.startswith(b"kp-") for v in seen) == 100, len(seen)

    kcat = ["kcat", "-b", b.addr, "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=SCRAM-SHA-512",
            "-X", "sasl.username=alice", "-X", "sasl.password=alice-pw"]
    subprocess.run(kcat + ["-t", "t", "-P"], input=b"from-kcat\n", check=True, timeout=30)
    out = subprocess.run(kcat + ["-t", "t", "-C", "-e", "-o", "beginning", "-q"], check=True,
                         capture_output=True, timeout=30).stdout
    assert out.count(b"\n") == 401 and b"from-kcat" in out

    # Refused, and nothing written.
    quick = {"socket.timeout.ms": 3000}
    for bad in (conf(b.addr, "alice", "wrong"), conf(b.addr, "nobody", "pw", mechanism="SCRAM-SHA-512"),
                conf(b.addr, "alice", "wrong", mechanism="PLAIN"), {"bootstrap.servers": b.addr}):
        acked, errors = produce(dict(bad, **quick), "t", 3, timeout=5)
        assert acked == 0 and len(errors) == 3, bad
    assert log_end(alice("PLAIN"), "t") == 401
    log = b.read_log()
    assert "SASL authentication refused" in log and "invalid proof" in log
    assert 'user Some("nobody")' in log


def test_scram_credentials_through_the_admin_api(make_broker):
    """AlterUserScramCredentials and DescribeUserScramCredentials from confluent-kafka's
    AdminClient: upsert, describe, Kafka's errors for bad requests, a changed password
    (the old one refused), and a removed user refused."""
    b = sasl_broker(make_broker)
    a = AdminClient(conf(b.addr, mechanism="SCRAM-SHA-512"))
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192)
    a.alter_user_scram_credentials([UserScramCredentialUpsertion("bob", info, b"bob-pw")])["bob"].result(30)
    described = a.describe_user_scram_credentials(["bob"])["bob"].result(30)
    infos = described.scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in infos] == [(ScramMechanism.SCRAM_SHA_256, 8192)]
    everyone = a.describe_user_scram_credentials().result(30)
    assert set(everyone) == {"admin", "bob"}

    create(conf(b.addr, "bob", "bob-pw"), "bt")
    assert produce(conf(b.addr, "bob", "bob-pw"), "bt", 10) == (10, [])
    # bob has no SCRAM-SHA-512 credential: that mechanism refuses him.
    assert produce(dict(conf(b.addr, "bob", "bob-pw", mechanism="SCRAM-SHA-512"),
                        **{"socket.timeout.ms": 3000}), "bt", 1, timeout=5)[0] == 0

    def code_of(future):
        with pytest.raises(KafkaException) as e:
            future.result(30)
        return e.value.args[0].code()

    from confluent_kafka import KafkaError
    assert code_of(a.describe_user_scram_credentials(["nobody"])["nobody"]) == KafkaError.RESOURCE_NOT_FOUND
    gone = UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_512)
    assert code_of(a.alter_user_scram_credentials([gone])["nobody"]) == KafkaError.RESOURCE_NOT_FOUND
    weak = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"pw")
    assert code_of(a.alter_user_scram_credentials([weak])["carol"]) == KafkaError.UNACCEPTABLE_CREDENTIAL
    twice = [UserScramCredentialUpsertion("dave", info, b"a"), UserScramCredentialUpsertion("dave", info, b"b")]
    assert code_of(a.alter_user_scram_credentials(twice)["dave"]) == KafkaError.DUPLICATE_RESOURCE
    assert set(a.describe_user_scram_credentials().result(30)) == {"admin", "bob"}

    # A new password: the old one no longer logs in.
    a.alter_user_scram_credentials([UserScramCredentialUpsertion("bob", info, b"new-pw")])["bob"].result(30)
    quick = {"socket.timeout.ms": 3000}
    assert produce(dict(conf(b.addr, "bob", "bob-pw"), **quick), "bt", 1, timeout=5)[0] == 0
    assert produce(conf(b.addr, "bob", "new-pw"), "bt", 1) == (1, [])
    # Removed: refused.
    bye = UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_256)
    a.alter_user_scram_credentials([bye])["bob"].result(30)
    assert produce(dict(conf(b.addr, "bob", "new-pw"), **quick), "bt", 1, timeout=5)[0] == 0
    assert log_end(conf(b.addr), "bt") == 11


def _handshake(s, mechanism, version=1, correlation=1):
    body = struct.pack(">hhi", 17, version, correlation) + struct.pack(">h", 3) + b"raw"
    body += struct.pack(">h", len(mechanism)) + mechanism
    r = _call(s, body)
    (code, n) = struct.unpack_from(">hi", r, 4)
    names, i = [], 10
    for _ in range(n):
        (ln,) = struct.unpack_from(">h", r, i)
        names.append(r[i + 2:i + 2 + ln].decode())
        i += 2 + ln
    return code, names


def _authenticate(s, token, correlation=2):
    body = struct.pack(">hhi", 36, 0, correlation) + struct.pack(">h", 3) + b"raw"
    body += struct.pack(">i", len(token)) + token
    r = _call(s, body)
    (code,) = struct.unpack_from(">h", r, 4)
    return code


def _api_versions(s, correlation=9):
    r = _call(s, struct.pack(">hhi", 18, 0, correlation) + struct.pack(">h", 3) + b"raw")
    (cid, code) = struct.unpack_from(">ih", r, 0)
    return cid, code


def test_the_exchange_before_and_after_authentication(make_broker):
    """Raw protocol: ApiVersions is answered before authentication, any other request
    closes the connection, an unoffered mechanism gets UNSUPPORTED_SASL_MECHANISM with
    the offered list, a v0 handshake's bare tokens log in, a second handshake after
    authentication is ILLEGAL_SASL_STATE, oversized and random input closes only its own
    connection — and the broker keeps serving."""
    b = make_broker(extra=sasl_flags(mechanisms="SCRAM-SHA-512,PLAIN"), env=BOOTSTRAP_ENV)
    with raw(b.addr) as s:
        assert _api_versions(s) == (9, 0)
        with pytest.raises((ConnectionError, OSError)):
            metadata_from(b.addr, topics=[], timeout=5)  # a new connection, no login
    with raw(b.addr) as s:
        assert _handshake(s, b"GSSAPI") == (33, ["SCRAM-SHA-512", "PLAIN"])
        assert closed(s)
    with raw(b.addr) as s:
        # Metadata before authentication: closed without an answer.
        body = struct.pack(">hhi", 3, 1, 5) + struct.pack(">h", 0) + struct.pack(">i", -1)
        s.sendall(struct.pack(">i", len(body)) + body)
        assert closed(s)
    with raw(b.addr) as s:
        # A v0 handshake: the PLAIN token and its answer are bare frames.
        assert _handshake(s, b"PLAIN", version=0) == (0, ["SCRAM-SHA-512", "PLAIN"])
        token = b"\0admin\0admin-secret"
        s.sendall(struct.pack(">i", len(token)) + token)
        assert s.recv(4) == b"\0\0\0\0"
        assert _api_versions(s, correlation=3) == (3, 0)
        # Logged in: the handshake again is out of place.
        assert _handshake(s, b"PLAIN", correlation=4)[0] == 34
    with raw(b.addr) as s:
        # SaslAuthenticate before any handshake: closed without an answer.
        body = struct.pack(">hhi", 36, 0, 2) + struct.pack(">h", 3) + b"raw" + struct.pack(">i", 0)
        s.sendall(struct.pack(">i", len(body)) + body)
        assert closed(s)
    with raw(b.addr) as s:
        # A request pipelined behind a failing login is never answered.
        assert _handshake(s, b"PLAIN")[0] == 0
        token = b"\0admin\0wrong"
        auth = struct.pack(">hhi", 36, 0, 2) + struct.pack(">h", 3) + b"raw" + struct.pack(">i", len(token)) + token
        md = struct.pack(">hhi", 3, 1, 3) + struct.pack(">h", 3) + b"raw" + struct.pack(">i", -1)
        s.sendall(struct.pack(">i", len(auth)) + auth + struct.pack(">i", len(md)) + md)
        (n,) = struct.unpack(">i", s.recv(4))
        answer = b""
        while len(answer) < n:
            answer += s.recv(n - len(answer))
        assert struct.unpack_from(">ih", answer, 0) == (2, 58)
        assert closed(s)
    with raw(b.addr) as s:
        # Oversized before authentication (512 KiB is the limit).
        s.sendall(struct.pack(">i", 1 << 20) + b"x" * 1024)
        assert closed(s)
    rng = random.Random(42)
    for mechanism in (b"SCRAM-SHA-512", b"PLAIN"):
        for _ in range(10):
            with raw(b.addr) as s:
                assert _handshake(s, mechanism)[0] == 0
                junk = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
                try:
                    code = _authenticate(s, junk)
                    assert code == 58, code
                except ConnectionError:
                    pass
                assert closed(s)
    # Still serving, and still answering the right password.
    assert metadata_from(b.addr, topics=[], sasl=ADMIN)["brokers"]
    assert "SASL authentication refused" in b.read_log()


def test_failed_logins_are_paced_per_address(make_broker):
    """30 failed logins from 127.0.0.2 spend that address's budget: its next attempts are
    checked one a second however many connections it opens at once (eight more at once
    take at least three seconds: at most four can find budget refilled while the first
    30 ran, the rest wait for turns a second apart), yet the right password still logs
    in from 127.0.0.2 after its turn, and 127.0.0.1 is not slowed."""
    from concurrent.futures import ThreadPoolExecutor
    b = make_broker(extra=sasl_flags(mechanisms="PLAIN"), env=BOOTSTRAP_ENV)

    def login(source, password):
        with raw(b.addr, source=source) as s:
            s.settimeout(30)
            assert _handshake(s, b"PLAIN")[0] == 0
            return _authenticate(s, b"\0admin\0" + password.encode())

    assert login("127.0.0.2", "admin-secret") == 0
    with ThreadPoolExecutor(10) as pool:
        assert list(pool.map(lambda _: login("127.0.0.2", "guess"), range(30))) == [58] * 30
        started = time.monotonic()
        assert list(pool.map(lambda _: login("127.0.0.2", "guess"), range(8))) == [58] * 8
        paced = time.monotonic() - started
    # A lower bound the broker's pacing guarantees (a slow machine only adds to it).
    assert paced >= 3.0, paced
    assert login("127.0.0.2", "admin-secret") == 0
    assert login("127.0.0.1", "admin-secret") == 0


def test_sasl_ssl(make_broker, certs, tmp_path):
    """SASL_SSL: SCRAM over TLS from confluent-kafka and PLAIN over TLS from kcat; a
    client without TLS gets nothing in; the CLIs take both in --command-config."""
    b = make_broker(extra=sasl_flags("SASL_SSL") + ssl_flags(certs)[2:], env=BOOTSTRAP_ENV)
    c = dict(conf(b.addr, mechanism="SCRAM-SHA-512", protocol="sasl_ssl"), **{"ssl.ca.location": certs("ca.pem")})
    create(c, "s")
    assert produce(c, "s", 200) == (200, [])
    kcat = ["kcat", "-b", b.addr, "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=PLAIN",
            "-X", "sasl.username=admin", "-X", "sasl.password=admin-secret", "-X", f"ssl.ca.location={certs('ca.pem')}"]
    out = subprocess.run(kcat + ["-t", "s", "-C", "-e", "-o", "beginning", "-q"], check=True,
                         capture_output=True, timeout=30).stdout
    assert out.count(b"\n") == 200
    plain_sasl = dict(conf(b.addr), **{"socket.timeout.ms": 3000})
    assert produce(plain_sasl, "s", 2, timeout=5)[0] == 0
    cfg = command_config(tmp_path, extra=f"ssl.ca.location={certs('ca.pem')}\n")
    text = open(cfg).read().replace("SASL_PLAINTEXT", "SASL_SSL")
    open(cfg, "w").write(text)
    r = sluice("user", "list", "--bootstrap", b.addr, "--command-config", cfg)
    assert r.returncode == 0 and "admin" in r.stdout, r.stderr
    assert log_end(c, "s") == 200


def test_bad_sasl_settings_are_refused(tmp_path):
    """A SASL listener without the bootstrap user, with a bad one, or with an unknown
    mechanism does not start, and says why; a bad --command-config is named."""
    cases = [
        (sasl_flags(), {}, "SLUICE_SASL_BOOTSTRAP_USER"),
        (sasl_flags(), {"SLUICE_SASL_BOOTSTRAP_USER": "no-colon"}, "name:password"),
        (sasl_flags(mechanisms="PLAIN,GSSAPI"), BOOTSTRAP_ENV, "GSSAPI"),
    ]
    for flags, env, want in cases:
        e = dict(os.environ)
        e.pop("SLUICE_SASL_BOOTSTRAP_USER", None)
        e.update(env)
        r = subprocess.run([SLUICE_BIN, "serve", "--listen", "127.0.0.1:1", "--data-dir", str(tmp_path / "d"),
                            *flags], capture_output=True, text=True, timeout=30, env=e)
        assert r.returncode != 0 and want in r.stderr, (flags, r.stderr)
    cfg = tmp_path / "bad.properties"
    cfg.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\nsasl.username=x\n")
    r = sluice("user", "list", "--command-config", str(cfg))
    assert r.returncode != 0 and "sasl.password" in r.stderr, r.stderr


def test_users_survive_restarts_and_controller_failover(tmp_path):
    """Three brokers on SASL listeners replicate (their fetchers log in as the bootstrap
    user): RF=3 acks=all works with full ISRs. A user made with `sluice user add` logs in
    on every broker, after every broker restarted, and after the controller leader is
    SIGKILLed, when another user can still be made."""
    c = Cluster(tmp_path / "c", n=3, extra=sasl_flags(), env=BOOTSTRAP_ENV, sasl=ADMIN)
    c.start()
    try:
        admin_cfg = command_config(tmp_path)
        r = sluice("user", "add", "erin", "--password", "erin-pw", "--mechanism", "SCRAM-SHA-256",
                   "--bootstrap", c.bootstrap, "--command-config", admin_cfg)
        assert r.returncode == 0, r.stderr
        erin = lambda addr: conf(addr, "erin", "erin-pw")  # noqa: E731
        create(erin(c.bootstrap), "rep", partitions=3, rf=3)
        assert produce(erin(c.bootstrap), "rep", 300) == (300, [])

        def full_isr():
            md = metadata_from(c.addr(1), ["rep"], sasl=ADMIN)
            parts = md["topics"].get("rep", {}).get("partitions", {})
            return len(parts) == 3 and all(len(p["isr"]) == 3 for p in parts.values())
        wait_until(full_isr, timeout=60, what="every ISR full over SASL")
        for i in c.ids:
            assert metadata_from(c.addr(i), topics=[], sasl=("erin", "erin-pw"))["brokers"]

        c.stop()
        c.start()
        for i in c.ids:
            assert metadata_from(c.addr(i), topics=[], sasl=("erin", "erin-pw"))["brokers"]
        # The last broker stopped led alone: the others rejoin the ISRs by fetching,
        # which they do logged in.
        wait_until(full_isr, timeout=60, what="every ISR full again after the restart")

        leader = metadata_from(c.addr(1), topics=[], sasl=ADMIN)["controller"]
        c.kill(leader)
        rest = next(c.addr(i) for i in c.ids if i != leader)

        def made():
            r = sluice("user", "add", "frank", "--password", "frank-pw", "--bootstrap", rest,
                       "--command-config", admin_cfg)
            return r.returncode == 0
        wait_until(made, timeout=60, interval=1, what="a user made after the controller failed over")
        for i in c.ids:
            if i != leader:
                assert metadata_from(c.addr(i), topics=[], sasl=("frank", "frank-pw"))["brokers"]
                assert metadata_from(c.addr(i), topics=[], sasl=("erin", "erin-pw"))["brokers"]
        assert len(consume_all(erin(rest), "rep", 300, timeout=60)) == 300
    finally:
        c.stop(expected_errors=["reach", "fetch", "connection"])
