"""Cross-check of scenario (a): the same load driven by librdkafka (confluent-kafka),
so that our figures are not an artifact of our own client. 100-byte values, acks=1,
8 partitions, as fast as the client goes for --seconds."""
import argparse
import json
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

ap = argparse.ArgumentParser()
ap.add_argument("--bootstrap", required=True)
ap.add_argument("--topic", required=True)
ap.add_argument("--seconds", type=float, default=10)
ap.add_argument("--out", required=True)
a = ap.parse_args()

admin = AdminClient({"bootstrap.servers": a.bootstrap})
for f in admin.create_topics([NewTopic(a.topic, 8, 1)]).values():
    try:
        f.result(30)
    except Exception as e:  # an existing topic is fine
        if "TOPIC_ALREADY_EXISTS" not in str(e):
            raise

acked = 0
errors = 0


def on_delivery(err, _msg):
    global acked, errors
    if err is None:
        acked += 1
    else:
        errors += 1


p = Producer({
    "bootstrap.servers": a.bootstrap, "acks": "1", "linger.ms": 5,
    "batch.size": 1048576, "queue.buffering.max.messages": 2000000,
    "queue.buffering.max.kbytes": 1048576, "compression.type": "none",
})
value = b"x" * 100
start = time.monotonic()
deadline = start + a.seconds
sent = 0
while time.monotonic() < deadline:
    for _ in range(10000):
        try:
            p.produce(a.topic, value, on_delivery=on_delivery)
            sent += 1
        except BufferError:
            p.poll(0.001)
    p.poll(0)
p.flush(60)
secs = time.monotonic() - start
report = {"kind": "librdkafka-produce", "records_per_sec": acked / secs, "mb_per_sec": acked * 100 / secs / 1e6,
          "records": acked, "errors": errors, "seconds": secs, "latency_ms": None,
          "config": {"acks": 1, "linger_ms": 5, "partitions": 8, "record_size": 100}}
json.dump(report, open(a.out, "w"), indent=2)
print(f"librdkafka: {report['records_per_sec']:.0f} records/s, {report['mb_per_sec']:.1f} MB/s, errors {errors}")
