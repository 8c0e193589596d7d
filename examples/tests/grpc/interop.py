#!/usr/bin/env python3
"""gRPC's interop cases, as Python's grpcio client runs them against a grpc:// server.

Usage: interop.py HOST:PORT CASE...

Runs each case against the examples' Tester and Streamer services (proto/testing.proto,
proto/streaming.proto) and exits non-zero on the first failure, naming it. Stubs are
generated from the repository's .proto files with grpcio-tools at start. With GRPC_CA set
to a PEM file, the channel is TLS trusting that authority; the case `refused` expects the
TLS handshake to fail (the server's certificate is not from that authority).
"""

import os
import sys
import threading
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stubs import generate, pattern  # noqa: E402

generate()
import echo_pb2  # noqa: E402
import streaming_pb2  # noqa: E402
import streaming_pb2_grpc  # noqa: E402
import testing_pb2  # noqa: E402
import testing_pb2_grpc  # noqa: E402
from google.protobuf import duration_pb2, empty_pb2  # noqa: E402

MAX = 64 << 20
OPTIONS = [("grpc.max_send_message_length", MAX), ("grpc.max_receive_message_length", MAX)]


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def expect_error(call, code, contains=None):
    try:
        call()
    except grpc.RpcError as e:
        check(e.code() == code, f"expected {code}, got {e.code()}: {e.details()}")
        if contains is not None:
            check(contains in (e.details() or ""), f"{contains!r} not in {e.details()!r}")
        return e
    raise AssertionError(f"expected {code}, the call succeeded")


def channel(target):
    """A channel to `target`: TLS trusting GRPC_CA's authority if it is set."""
    ca = os.environ.get("GRPC_CA")
    if ca is None:
        return grpc.insecure_channel(target, options=OPTIONS)
    with open(ca, "rb") as f:
        credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
    return grpc.secure_channel(target, credentials, options=OPTIONS)


def refused(target):
    stub = testing_pb2_grpc.TesterStub(channel(target))
    expect_error(lambda: stub.Now(empty_pb2.Empty(), timeout=5), grpc.StatusCode.UNAVAILABLE)


class Cases:
    def __init__(self, target):
        self.channel = channel(target)
        grpc.channel_ready_future(self.channel).result(timeout=10)
        self.tester = testing_pb2_grpc.TesterStub(self.channel)
        self.streamer = streaming_pb2_grpc.StreamerStub(self.channel)

    def empty_unary(self):
        reply = self.tester.Now(empty_pb2.Empty(), timeout=10)
        check(abs(reply.seconds - time.time()) < 60, f"the server's clock says {reply}")

    def large_unary(self):
        # The interop suite's sizes, then messages of several MiB each way.
        for request_len, reply_len in [(271828, 314159), (0, 0), (5 << 20, 7 << 20)]:
            reply = self.tester.Bulk(testing_pb2.BulkRequest(
                reply_len=reply_len, seed=3, payload=pattern(request_len, 3)), timeout=30)
            check(reply.matched, f"the server saw a corrupt payload of {request_len} bytes")
            check(reply.received == request_len, f"received {reply.received}")
            check(reply.payload == pattern(reply_len, 3), f"reply of {reply_len} bytes differs")

    def metadata(self):
        binary = bytes(range(256))
        sent = [("x-token", "abc ~ 123"), ("x-raw-bin", binary),
                ("trailer-rows", "12"), ("trailer-sum-bin", b"\x00\xff\n")]
        reply, call = self.tester.Echo.with_call(
            echo_pb2.EchoRequest(payload=b"hi", seq=7), metadata=sent, timeout=10)
        check(reply.payload == b"hi" and reply.seq == 7, f"echo {reply}")
        headers = dict(call.initial_metadata())
        trailers = dict(call.trailing_metadata())
        check(headers.get("x-token") == "abc ~ 123", f"headers {headers}")
        check(headers.get("x-raw-bin") == binary, f"binary header {headers.get('x-raw-bin')!r}")
        scheme = "grpcs" if os.environ.get("GRPC_CA") else "grpc"
        check(headers.get("peer-addr", "").startswith(f"{scheme}://127.0.0.1:"), f"peer {headers}")
        check(trailers.get("trailer-rows") == "12", f"trailers {trailers}")
        check(trailers.get("trailer-sum-bin") == b"\x00\xff\n", f"trailers {trailers}")
        check("x-token" not in trailers, "a header came as a trailer")

    def status_code_and_message(self):
        message = "\t\ntest with whitespace\r\nand Unicode BMP ☺ and non-BMP 😈\t\n"
        details = b"\x08\x02\x12\x04oops"
        e = expect_error(lambda: self.tester.Fail(testing_pb2.FailRequest(
            code=2, message=message, details=details),
            metadata=[("x-why", "asked")], timeout=10), grpc.StatusCode.UNKNOWN)
        check(e.details() == message, f"message {e.details()!r}")
        trailers = dict(e.trailing_metadata())
        check(trailers.get("grpc-status-details-bin") == details, f"details {trailers}")
        check(trailers.get("x-why") == "asked", f"status metadata {trailers}")

    def unimplemented(self):
        for path in ["/rpc.testing.Tester/Nope", "/grpc.testing.UnimplementedService/X"]:
            call = self.channel.unary_unary(path)
            expect_error(lambda: call(b"", timeout=10), grpc.StatusCode.UNIMPLEMENTED, path)

    def panic(self):
        expect_error(lambda: self.tester.Panic(empty_pb2.Empty(), timeout=10),
                     grpc.StatusCode.INTERNAL, "panicked")

    def server_streaming(self):
        call = self.streamer.Produce(
            streaming_pb2.ProduceRequest(count=4, size=31415),
            metadata=[("header-kind", "chunks"), ("trailer-done", "yes")], timeout=10)
        chunks = list(call)
        check([c.index for c in chunks] == [0, 1, 2, 3], f"indices {[c.index for c in chunks]}")
        check(all(c.payload == pattern(31415, 0) for c in chunks), "a chunk differs")
        check(dict(call.initial_metadata()).get("header-kind") == "chunks", "headers")
        check(dict(call.trailing_metadata()).get("trailer-done") == "yes", "trailers")
        check(call.code() == grpc.StatusCode.OK, f"status {call.code()}")
        # Many small messages: the dispatcher's window is returned as they are read.
        many = list(self.streamer.Produce(
            streaming_pb2.ProduceRequest(count=5000, size=8), timeout=30))
        check([c.index for c in many] == list(range(5000)), "5000 messages out of order")

    def server_streaming_error(self):
        call = self.streamer.Produce(streaming_pb2.ProduceRequest(
            count=5, size=10, fail_code=9, fail_after=2), timeout=10)
        got = []
        try:
            for chunk in call:
                got.append(chunk.index)
            raise AssertionError("the stream did not fail")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.FAILED_PRECONDITION, f"status {e.code()}")
            check(e.details() == "failed after 2 chunks", f"message {e.details()!r}")
            trailers = dict(e.trailing_metadata())
            check(trailers.get("grpc-status-details-bin") == (2).to_bytes(8, "little"),
                  f"details {trailers}")
        check(got == [0, 1], f"chunks before the failure {got}")

    def client_streaming(self):
        sizes = [27182, 8, 1828, 45904]
        chunks = (streaming_pb2.Chunk(index=i, payload=pattern(n, 0)) for i, n in enumerate(sizes))
        summary, call = self.streamer.Consume.with_call(
            chunks, metadata=[("trailer-n", "4")], timeout=10)
        check(summary.chunks == 4 and summary.bytes == sum(sizes) and summary.in_order,
              f"summary {summary}")
        check(dict(call.trailing_metadata()).get("trailer-n") == "4", "trailers")
        # More messages than the initial stream window, each waiting for room.
        many = (streaming_pb2.Chunk(index=i, payload=pattern(4096, 0)) for i in range(500))
        summary = self.streamer.Consume(many, timeout=30)
        check(summary.chunks == 500 and summary.in_order, f"summary {summary}")

    def ping_pong(self):
        outgoing = []
        ready = threading.Condition()

        def requests():
            for i, n in enumerate([31415, 9, 2653, 58979]):
                with ready:
                    ready.wait_for(lambda: len(outgoing) == i)
                yield streaming_pb2.Chunk(index=i, payload=pattern(n, 0))

        call = self.streamer.Chat(requests(), metadata=[("trailer-chat", "over")], timeout=10)
        for i, reply in enumerate(call):
            check(reply.index == i, f"reply {reply.index} for {i}")
            with ready:
                outgoing.append(reply)
                ready.notify_all()
        check(len(outgoing) == 4, f"{len(outgoing)} replies")
        check(dict(call.trailing_metadata()).get("trailer-chat") == "over", "trailers")

    def empty_stream(self):
        call = self.streamer.Chat(iter([]), timeout=10)
        check(list(call) == [], "replies to nothing")
        check(call.code() == grpc.StatusCode.OK, f"status {call.code()}")

    def stream_fails_before_headers(self):
        call = self.streamer.Chat(iter([]), metadata=[("fail-with", "7"), ("trailer-x", "y")],
                                  timeout=10)
        try:
            list(call)
            raise AssertionError("the stream did not fail")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.PERMISSION_DENIED, f"status {e.code()}")
            check(e.details() == "asked to fail", f"message {e.details()!r}")
            check(dict(e.trailing_metadata()).get("trailer-x") == "y", "status metadata")

    def deadline(self):
        started = time.monotonic()
        expect_error(lambda: self.tester.Sleep(testing_pb2.SleepRequest(
            duration=duration_pb2.Duration(seconds=20)), timeout=0.3),
            grpc.StatusCode.DEADLINE_EXCEEDED)
        check(time.monotonic() - started < 5, "the deadline took too long")
        call = self.streamer.Produce(streaming_pb2.ProduceRequest(
            count=1000, size=1, interval=duration_pb2.Duration(nanos=50_000_000)), timeout=0.3)
        expect_error(lambda: list(call), grpc.StatusCode.DEADLINE_EXCEEDED)

    def cancel(self):
        # A unary call cancelled while its handler sleeps, then a stream after its first
        # message (cancel_after_first_response).
        future = self.tester.Sleep.future(testing_pb2.SleepRequest(
            duration=duration_pb2.Duration(seconds=20)), timeout=30)
        time.sleep(0.3)
        future.cancel()
        check(future.cancelled(), "the call was not cancelled")
        call = self.streamer.Produce(streaming_pb2.ProduceRequest(
            count=1000, size=1, interval=duration_pb2.Duration(nanos=20_000_000)), timeout=30)
        first = next(call)
        check(first.index == 0, f"first {first}")
        call.cancel()
        expect_error(lambda: list(call), grpc.StatusCode.CANCELLED)
        time.sleep(0.3)

    def too_large(self):
        # The server's limit is 16 MiB.
        e = expect_error(lambda: self.tester.Bulk(testing_pb2.BulkRequest(
            payload=b"\0" * (17 << 20)), timeout=30), grpc.StatusCode.RESOURCE_EXHAUSTED)
        check("request message" in e.details(), f"message {e.details()!r}")
        # The connection still serves.
        self.empty_unary()

    def health(self):
        # As a Kubernetes gRPC probe asks (grpcio-health-checking's own stubs).
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        health = health_pb2_grpc.HealthStub(self.channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        for service in ["", "rpc.testing.Tester"]:
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            check(reply.status == serving, f"{service!r}: {reply}")
        expect_error(lambda: health.Check(health_pb2.HealthCheckRequest(service="nope"),
                                          timeout=10), grpc.StatusCode.NOT_FOUND)
        watch = health.Watch(health_pb2.HealthCheckRequest(service="rpc.testing.Tester"),
                             timeout=10)
        check(next(watch).status == serving, "the first watched status")
        watch.cancel()

    def reflection(self):
        # As grpcurl and grpcio's own reflection client discover a server.
        from google.protobuf.descriptor_pool import DescriptorPool
        from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
            ProtoReflectionDescriptorDatabase)
        database = ProtoReflectionDescriptorDatabase(self.channel)
        services = set(database.get_services())
        for service in ["rpc.testing.Tester", "rpc.streaming.Streamer", "grpc.health.v1.Health",
                        "grpc.reflection.v1.ServerReflection",
                        "grpc.reflection.v1alpha.ServerReflection"]:
            check(service in services, f"{service} not listed: {sorted(services)}")
        pool = DescriptorPool(database)
        tester = pool.FindServiceByName("rpc.testing.Tester")
        methods = {m.name: m for m in tester.methods}
        check({"Echo", "Sleep", "Fail", "Now", "Panic", "Bulk"} <= set(methods), f"{methods}")
        check(methods["Now"].output_type.full_name == "google.protobuf.Timestamp", "Now's type")
        bulk = pool.FindMessageTypeByName("rpc.testing.BulkRequest")
        check([f.name for f in bulk.fields] == ["reply_len", "seed", "payload", "delay"],
              f"{[f.name for f in bulk.fields]}")
        chunk = pool.FindMessageTypeByName("rpc.streaming.Chunk")
        check(chunk.fields_by_name["payload"].number == 2, "Chunk.payload")
        try:
            pool.FindMessageTypeByName("rpc.testing.NoSuchThing")
            raise AssertionError("an unknown symbol was found")
        except KeyError:
            pass

    def concurrent(self):
        futures = [self.tester.Echo.future(echo_pb2.EchoRequest(payload=bytes([i]) * i, seq=i),
                                           timeout=30) for i in range(200)]
        for i, f in enumerate(futures):
            reply = f.result()
            check(reply.seq == i and reply.payload == bytes([i]) * i, f"reply {i}")


def main():
    target, cases = sys.argv[1], sys.argv[2:]
    runner = None if cases == ["refused"] else Cases(target)
    for case in cases:
        started = time.monotonic()
        try:
            if case == "refused":
                refused(target)
            else:
                getattr(runner, case)()
        except Exception as e:  # noqa: BLE001
            print(f"FAIL {case}: {type(e).__name__}: {e}", flush=True)
            sys.exit(1)
        print(f"ok   {case} ({time.monotonic() - started:.2f} s)", flush=True)


if __name__ == "__main__":
    main()
