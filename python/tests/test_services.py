"""The Python package against the real servers `scripts/services.sh` starts (the S3 server and
the Kafka broker; scripts/test.sh exports their addresses): a Kafka-sourced pipeline equals
what `sluice run` reads from the same topic, an S3-sourced one equals the local read of the
same file, their errors are the CLI's, and Ctrl-C stops a wait for records that never come."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid

import boto3
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import sluice
from conftest import REPO, read_parts, run_cli

SECRET = "sluice-test-secret-4f9c2e71d0"


def need(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run the suite with scripts/test.sh (it starts the servers)")
    return value


def create_topic(partitions: int) -> str:
    brokers = need("SLUICE_TEST_KAFKA_BROKERS")
    name = f"py-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": brokers})  # alive until the answer came
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=60)
    return name


def test_a_kafka_pipeline_reads_what_sluice_run_reads(tmp_path, sluice_bin, monkeypatch):
    brokers = need("SLUICE_TEST_KAFKA_BROKERS")
    topic = create_topic(2)
    env = {"SLUICE_KAFKA_BROKERS": brokers, "SLUICE_KAFKA_TOPIC": topic}
    published = run_cli(sluice_bin, "run", "configs/digits-to-kafka.yaml", "--no-report", env=env)
    assert published.returncode == 0, published.stderr
    cli_out = tmp_path / "cli"
    read = run_cli(sluice_bin, "run", "configs/kafka-to-parquet.yaml", "--no-report", env={**env, "SLUICE_OUT_DIR": str(cli_out)})
    assert read.returncode == 0, read.stderr
    expected = read_parts(cli_out / "digits")
    for k, v in {**env, "SLUICE_OUT_DIR": str(tmp_path / "py")}.items():
        monkeypatch.setenv(k, v)
    batches = list(sluice.Pipeline(REPO / "configs/kafka-to-parquet.yaml"))
    got = pa.Table.from_batches([b.to_arrow() for b in batches])
    assert got.num_rows == expected.num_rows == 1437
    # The same rows in the same order: static assignment and a seeded shuffle decide it.
    assert got.replace_schema_metadata(None).equals(expected.replace_schema_metadata(None))
    spans = [s for b in batches for s in b.lineage()]
    assert {s["topic"] for s in spans} == {topic} and {s["partition"] for s in spans} <= {0, 1}
    assert sum(s["len"] for s in spans) == 1437


INTERRUPT = """
import signal, sys, traceback, sluice
# Python's own Ctrl-C handler, also when the test runner was started with SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
pipe = sluice.Pipeline(sys.argv[1])
while True:
    try:
        print("waiting", flush=True)
        next(pipe)  # WAIT
        print("a batch came", flush=True)
        sys.exit(4)
    except KeyboardInterrupt as e:
        # Raised inside the wait, or (the signal came early) before it: then again.
        waiting = any("# WAIT" in (f.line or "") for f in traceback.extract_tb(e.__traceback__))
        print("interrupted" if waiting else "early", flush=True)
        if waiting:
            break
# Iterating again goes on where it stopped: the record produced meanwhile comes.
assert sys.stdin.readline().strip() == "produced"
batch = next(pipe)
print("x", batch.to_numpy()["x"].tolist(), flush=True)
"""


def main_thread_state(pid: int) -> str:
    """The kernel's state letter for the process's main thread (`S`: asleep, `R`: running)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "gone"


def test_ctrl_c_stops_a_wait_for_records_that_never_come_and_iteration_goes_on(tmp_path):
    brokers = need("SLUICE_TEST_KAFKA_BROKERS")
    topic = create_topic(1)  # empty, and read without `until`: the wait never ends by itself
    config = tmp_path / "follow.yaml"
    config.write_text(f"source: {{type: kafka, brokers: '{brokers}', topic: {topic}, format: json, schema: {{x: int64}}}}\n")
    script = tmp_path / "interrupt.py"  # a file, so that the traceback has its lines
    script.write_text(INTERRUPT)
    child = subprocess.Popen(
        [sys.executable, str(script), str(config)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    answers = []
    # A wait Ctrl-C cannot stop would block readline() forever: the watchdog ends the child,
    # readline() returns "" and the test fails.
    watchdog = threading.Timer(120, child.kill)
    watchdog.start()
    try:
        for _ in range(50):
            assert child.stdout.readline().strip() == "waiting"
            # Sent as soon as "waiting" is read, the signal mostly lands before the wait: wait
            # first until the child's main thread sleeps (blocked in the wait for a batch).
            while child.poll() is None and main_thread_state(child.pid) != "S":
                pass
            child.send_signal(signal.SIGINT)
            answers.append(child.stdout.readline().strip())
            if answers[-1] != "early":
                break
        if answers[-1] == "interrupted":
            producer = Producer({"bootstrap.servers": brokers})
            producer.produce(topic, b'{"x": 42}')
            assert producer.flush(60) == 0
            child.stdin.write("produced\n")
            child.stdin.flush()
        out, err = child.communicate(timeout=60)
    finally:
        watchdog.cancel()
        child.kill()
    assert answers[-1] == "interrupted", f"{answers}\n{err}"
    assert child.returncode == 0, f"{answers}\n{out}\n{err}"
    assert out.strip() == "x [42]", out


@pytest.fixture
def s3_env(monkeypatch):
    endpoint = need("SLUICE_TEST_S3_ENDPOINT")
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "sluicetestkey",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=SECRET)
    bucket = f"py-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    return s3, bucket


def test_an_s3_pipeline_equals_the_local_read_of_the_same_files(s3_env):
    s3, bucket = s3_env
    for split in ("train", "test"):
        s3.upload_file(str(REPO / f"data/digits/{split}.parquet"), bucket, f"digits/{split}.parquet")
    stages = "stages:\n  - {type: shuffle, buffer_rows: 256, seed: 3}\n  - {type: batch, size: 100}\n"
    local = f"source: {{type: parquet, path: '{REPO}/data/digits/*.parquet'}}\n{stages}"
    remote = f"source: {{type: parquet, path: 's3://{bucket}/digits/*.parquet'}}\n{stages}"
    want = pa.Table.from_batches([b.to_arrow() for b in sluice.Pipeline(local)])
    got_batches = list(sluice.Pipeline(remote))
    got = pa.Table.from_batches([b.to_arrow() for b in got_batches])
    assert got.num_rows == 1437 + 360
    assert got.equals(want)
    urls = {s["url"] for b in got_batches for s in b.lineage()}
    assert urls == {f"s3://{bucket}/digits/train.parquet", f"s3://{bucket}/digits/test.parquet"}

    with pytest.raises(sluice.DataError) as missing:
        next(sluice.Pipeline(f"source: {{type: parquet, path: 's3://{bucket}/nothing/*.parquet'}}\n"))
    assert f"s3://{bucket}/nothing/" in str(missing.value)

    assert SECRET not in str(missing.value)
    # (Refused credentials are the Rust suite's: moto accepts any key unless a proxy refuses it,
    # tests/s3.rs.)
