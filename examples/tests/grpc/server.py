#!/usr/bin/env python3
"""The examples' Tester and Streamer services (examples/src/services.rs, streamer.rs) on
Python's grpcio server: the gRPC peer our generated clients are tested against over grpc://.

Usage: server.py   (prints the port it listens on, on 127.0.0.1; serves until stdin closes)
"""

import os
import sys
import threading
import time
from concurrent import futures

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stubs import generate, pattern  # noqa: E402

generate()
import echo_pb2  # noqa: E402
import streaming_pb2  # noqa: E402
import streaming_pb2_grpc  # noqa: E402
import testing_pb2  # noqa: E402
import testing_pb2_grpc  # noqa: E402
from google.protobuf import empty_pb2, timestamp_pb2  # noqa: E402

MAX = 64 << 20
CODES = {code.value[0]: code for code in grpc.StatusCode}
STATS = {"sleeps_cancelled": 0, "produce_cancelled": 0}
LOCK = threading.Lock()


def count(what):
    with LOCK:
        STATS[what] += 1


def asked(context, prefix):
    return [(k, v) for k, v in context.invocation_metadata() if k.startswith(prefix)]


def fail(context, code, message, metadata, details=b""):
    trailing = list(metadata)
    if details:
        trailing.append(("grpc-status-details-bin", details))
    context.set_trailing_metadata(trailing)
    context.abort(CODES.get(code, grpc.StatusCode.UNKNOWN), message)


def seconds(duration):
    return duration.seconds + duration.nanos / 1e9


class Tester(testing_pb2_grpc.TesterServicer):
    def Echo(self, request, context):
        headers = [(k, v) for k, v in context.invocation_metadata() if k != "user-agent"]
        headers.append(("peer-addr", context.peer()))
        context.send_initial_metadata(headers)
        context.set_trailing_metadata(asked(context, "trailer-"))
        return echo_pb2.EchoReply(payload=request.payload, seq=request.seq)

    def Sleep(self, request, context):
        until = time.monotonic() + seconds(request.duration)
        while time.monotonic() < until:
            if not context.is_active():
                count("sleeps_cancelled")
                return empty_pb2.Empty()
            time.sleep(0.01)
        return empty_pb2.Empty()

    def Fail(self, request, context):
        metadata = [(k, v) for k, v in context.invocation_metadata() if k != "user-agent"]
        if dict(metadata).get("headers-first"):
            # Headers, then the error: the status comes in trailers after them.
            context.send_initial_metadata([("x-sent", "first")])
        fail(context, request.code, request.message, metadata, request.details)

    def Now(self, request, context):
        # The peer's own counters, for tests that check what it saw.
        with LOCK:
            context.send_initial_metadata([(k.replace("_", "-"), str(v))
                                           for k, v in STATS.items()])
        stamp = timestamp_pb2.Timestamp()
        stamp.GetCurrentTime()
        return stamp

    def Bulk(self, request, context):
        return testing_pb2.BulkReply(
            matched=request.payload == pattern(len(request.payload), request.seed),
            received=len(request.payload),
            payload=pattern(request.reply_len, request.seed))


class Streamer(streaming_pb2_grpc.StreamerServicer):
    def Produce(self, request, context):
        context.send_initial_metadata(asked(context, "header-"))
        trailers = asked(context, "trailer-")
        payload = pattern(request.size, 0)
        last = request.count
        if request.fail_code and request.fail_after <= request.count:
            last = request.fail_after
        for index in range(last):
            if request.interval.seconds or request.interval.nanos:
                time.sleep(seconds(request.interval))
            if not context.is_active():
                count("produce_cancelled")
                return
            yield streaming_pb2.Chunk(index=index, payload=payload)
        if last != request.count or request.fail_code:
            fail(context, request.fail_code, f"failed after {last} chunks", trailers,
                 last.to_bytes(8, "little"))
        context.set_trailing_metadata(trailers)

    def Consume(self, request_iterator, context):
        trailers = asked(context, "trailer-")
        summary = streaming_pb2.ConsumeSummary(in_order=True)
        for chunk in request_iterator:
            summary.in_order &= (chunk.index == summary.chunks
                                 and chunk.payload == pattern(len(chunk.payload), 0))
            summary.chunks += 1
            summary.bytes += len(chunk.payload)
        context.set_trailing_metadata(trailers)
        return summary

    def Chat(self, request_iterator, context):
        trailers = asked(context, "trailer-")
        code = dict(context.invocation_metadata()).get("fail-with")
        if code is not None:
            fail(context, int(code), "asked to fail", trailers)
        for chunk in request_iterator:
            yield chunk
        context.set_trailing_metadata(trailers)


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=[
        ("grpc.max_send_message_length", MAX), ("grpc.max_receive_message_length", MAX)])
    testing_pb2_grpc.add_TesterServicer_to_server(Tester(), server)
    streaming_pb2_grpc.add_StreamerServicer_to_server(Streamer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(grace=1).wait()


if __name__ == "__main__":
    main()
