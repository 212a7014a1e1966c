"""Small Kafka admin and inspection commands for the shell scripts.

Uses confluent-kafka (a recent bundled librdkafka); Debian's kcat is too old
for the local broker. Run with the Python of the cached environment that
scripts/services creates.

    kafka_admin.py --bootstrap HOST:PORT wait [--timeout S]
    kafka_admin.py --bootstrap HOST:PORT create-topics NAME:PARTITIONS...
    kafka_admin.py --bootstrap HOST:PORT round-trip TOPIC
    kafka_admin.py --bootstrap HOST:PORT produce TOPIC KEY VALUE [--header NAME=VALUE]...
"""

import argparse
import json
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def fail(message):
    print(f"kafka_admin: {message}", file=sys.stderr)
    sys.exit(1)


def wait(bootstrap, timeout):
    """Returns once the broker answers a metadata request."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            metadata = admin.list_topics(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            print(f"broker answers on {bootstrap}: {len(metadata.brokers)} broker(s), {len(metadata.topics)} topic(s)")
            return
        except KafkaException as error:
            last_error = error
            time.sleep(0.2)
    fail(f"no metadata answer from {bootstrap} within {timeout} s: {last_error}")


def create_topics(bootstrap, specs):
    """Creates topics; an existing topic must have at least the partitions asked for."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = {}
    for spec in specs:
        name, _, partitions = spec.partition(":")
        if not name or not partitions.isdigit():
            fail(f"expected NAME:PARTITIONS, got {spec!r}")
        wanted[name] = int(partitions)
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=count, replication_factor=1) for name, count in wanted.items()],
        operation_timeout=30,
    )
    for name, future in futures.items():
        try:
            future.result()
            print(f"created topic {name} with {wanted[name]} partitions")
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                fail(f"creating topic {name}: {error}")
    metadata = admin.list_topics(timeout=10)
    for name, count in wanted.items():
        actual = len(metadata.topics[name].partitions)
        if actual < count:
            fail(f"topic {name} exists with {actual} partitions; {count} are needed")
        print(f"topic {name}: {actual} partitions")


def round_trip(bootstrap, topic):
    """Produces one keyed record with headers and reads it back by its offset."""
    message_id = str(uuid.uuid4())
    key = f"demo-{message_id[:8]}"
    value = json.dumps({"hello": "entrega", "id": message_id}).encode()
    delivered = {}

    def on_delivery(error, message):
        if error is not None:
            fail(f"delivery failed: {error}")
        delivered["partition"], delivered["offset"] = message.partition(), message.offset()

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    producer.produce(topic, key=key, value=value, headers=[("id", message_id), ("eventType", "Demo")], on_delivery=on_delivery)
    if producer.flush(30) != 0:
        fail("the record was not acknowledged within 30 s")
    print(f"produced  {topic}[{delivered['partition']}]@{delivered['offset']} key={key} id={message_id}")

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-{message_id}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, delivered["partition"], delivered["offset"])])
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                fail(f"consuming: {message.error()}")
            headers = {name: raw.decode() for name, raw in message.headers() or []}
            print(
                f"consumed  {topic}[{message.partition()}]@{message.offset()} key={message.key().decode()} "
                f"headers={json.dumps(headers)} value={message.value().decode()}"
            )
            if headers.get("id") != message_id or message.value() != value:
                fail("the consumed record is not the produced one")
            return
    finally:
        consumer.close()
    fail("the produced record was not consumed within 30 s")


def produce(bootstrap, topic, key, value, headers):
    """Produces one record as given (for the demo's poison event)."""
    delivered = {}

    def on_delivery(error, message):
        if error is not None:
            fail(f"delivery failed: {error}")
        delivered["at"] = f"{message.topic()}[{message.partition()}]@{message.offset()}"

    pairs = []
    for header in headers:
        name, _, text = header.partition("=")
        pairs.append((name, text))
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "partitioner": "murmur2_random"})
    producer.produce(topic, key=key, value=value.encode(), headers=pairs, on_delivery=on_delivery)
    if producer.flush(30) != 0:
        fail("the record was not acknowledged within 30 s")
    print(f"produced {delivered['at']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    commands = parser.add_subparsers(dest="command", required=True)
    wait_parser = commands.add_parser("wait")
    wait_parser.add_argument("--timeout", type=float, default=30)
    create_parser = commands.add_parser("create-topics")
    create_parser.add_argument("specs", nargs="+")
    round_trip_parser = commands.add_parser("round-trip")
    round_trip_parser.add_argument("topic")
    produce_parser = commands.add_parser("produce")
    produce_parser.add_argument("topic")
    produce_parser.add_argument("key")
    produce_parser.add_argument("value")
    produce_parser.add_argument("--header", action="append", default=[])
    args = parser.parse_args()

    if args.command == "wait":
        wait(args.bootstrap, args.timeout)
    elif args.command == "create-topics":
        create_topics(args.bootstrap, args.specs)
    elif args.command == "produce":
        produce(args.bootstrap, args.topic, args.key, args.value, args.header)
    else:
        round_trip(args.bootstrap, args.topic)


if __name__ == "__main__":
    main()
