"""What the grpcio peers share: the stubs of the repository's .proto files, generated with
grpcio-tools into a temporary directory, and the examples' bulk pattern."""

import functools
import os
import sys
import tempfile

from grpc_tools import protoc

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PROTO = os.path.join(ROOT, "proto")
INCLUDE = os.path.join(ROOT, "rpc-codegen", "proto-include")
WELL_KNOWN = os.path.join(os.path.dirname(protoc.__file__), "_proto")


def generate():
    out = tempfile.mkdtemp(prefix="rdma-rpc-grpc-")
    for proto in ["echo.proto", "testing.proto", "streaming.proto",
                  "google/api/annotations.proto", "google/api/http.proto"]:
        args = ["protoc", f"-I{PROTO}", f"-I{INCLUDE}", f"-I{WELL_KNOWN}",
                f"--python_out={out}", f"--grpc_python_out={out}", proto]
        if protoc.main(args) != 0:
            sys.exit(f"grpc_tools.protoc failed on {proto}")
    sys.path.insert(0, out)


@functools.lru_cache(maxsize=64)
def pattern(length, seed):
    """The examples' bulk_pattern: 64 KiB blocks, each starting with its tagged index."""
    block_len = 64 * 1024
    block = bytes(((i * 131 + seed) & 0xFF) for i in range(block_len))
    out = bytearray()
    index = 0
    while len(out) < length:
        take = min(block_len, length - len(out))
        start = len(out)
        out += block[:take]
        tag = ((index ^ seed) & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")
        tagged = min(len(tag), take)
        out[start:start + tagged] = tag[:tagged]
        index += 1
    return bytes(out)


