"""Issue 40's real-client row of the scale benchmark: confluent-kafka (librdkafka) at
its defaults (acks=all, idempotence as it ships) plus linger.ms=5 produces 100-byte
records at --rate records/s, spread round-robin over every partition of the topics
`<prefix>-0 .. <prefix>-<topics-1>` (created by `sluice-bench scale`), for --seconds.
Latency is librdkafka's own per message (Message.latency(): from produce() to the
acknowledgement, its batching included). Writes a JSON report to --out."""
import argparse
import json
import time

from confluent_kafka import Producer

ap = argparse.ArgumentParser()
ap.add_argument("--bootstrap", required=True)
ap.add_argument("--prefix", required=True)
ap.add_argument("--topics", type=int, required=True)
ap.add_argument("--partitions", type=int, required=True)
ap.add_argument("--rate", type=float, default=50000)
ap.add_argument("--seconds", type=float, default=10)
ap.add_argument("--out", required=True)
a = ap.parse_args()

targets = [(f"{a.prefix}-{t}", p) for t in range(a.topics) for p in range(a.partitions)]
latencies = []
errors = [0]


def on_delivery(err, msg):
    if err is None:
        latencies.append(msg.latency())
    else:
        errors[0] += 1


p = Producer({"bootstrap.servers": a.bootstrap, "linger.ms": 5,
              "queue.buffering.max.messages": 2_000_000})
value = b"x" * 100
# Metadata for every topic before the clock starts.
p.list_topics(timeout=60)
sent = 0
start = time.monotonic()
end = start + a.seconds
while True:
    now = time.monotonic()
    if now >= end:
        break
    due = int((now - start) * a.rate) - sent
    for _ in range(due):
        topic, part = targets[sent % len(targets)]
        while True:
            try:
                p.produce(topic, value, partition=part, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
        sent += 1
    p.poll(0.001 if due == 0 else 0)
left = p.flush(120)
seconds = time.monotonic() - start
lat = sorted(latencies)


def pct(q):
    return round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 3) if lat else None


report = {"name": "rdkafka-scale", "config": {"rate": a.rate, "seconds": a.seconds, "record_size": 100,
                                               "partitions": len(targets), "linger_ms": 5, "acks": "all"},
          "result": {"sent": sent, "acked": len(lat), "errors": errors[0], "unflushed": left,
                     "records_per_sec": len(lat) / a.seconds,
                     "latency_ms": {"p50": pct(0.50), "p99": pct(0.99), "p999": pct(0.999),
                                    "max": pct(1.0)}}}
with open(a.out, "w") as f:
    json.dump(report, f)
print("rdkafka-scale:", json.dumps(report["result"]))
