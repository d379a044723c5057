#!/usr/bin/python3
"""Calls one unary RPC of the daemon with hand-encoded protobuf bytes, independently of the
project's client library. Prints the gRPC status code name and, for health checks, the status.

  raw_rpc.py ADDR health [SERVICE]         -> SERVING / NOT_SERVING / <code>
  raw_rpc.py ADDR list [--token T]         -> OK <n bytes> / <code>
  raw_rpc.py ADDR open MODEL [--token T]   -> OK / <code>: message
"""
import sys

import grpc


def field_string(number, text):
    data = text.encode()
    return bytes([number << 3 | 2, len(data)]) + data


def main(argv):
    addr, what = argv[1], argv[2]
    rest = argv[3:]
    token = None
    if "--token" in rest:
        i = rest.index("--token")
        token = rest[i + 1]
        rest = rest[:i] + rest[i + 2:]
    metadata = [("authorization", "Bearer " + token)] if token else None
    channel = grpc.insecure_channel(addr)
    try:
        if what == "health":
            call = channel.unary_unary("/grpc.health.v1.Health/Check")
            reply = call(field_string(1, rest[0]) if rest else b"", timeout=5)
            status = reply[1] if len(reply) >= 2 else 0
            print({1: "SERVING", 2: "NOT_SERVING"}.get(status, "UNKNOWN"))
        elif what == "list":
            call = channel.unary_unary("/expertd.v1.Expertd/ListModels")
            reply = call(b"", timeout=5, metadata=metadata)
            print("OK", len(reply))
        elif what == "open":
            call = channel.unary_unary("/expertd.v1.Expertd/OpenSession")
            call(field_string(1, rest[0]), timeout=5, metadata=metadata)
            print("OK")
        else:
            print("usage error", file=sys.stderr)
            return 2
    except grpc.RpcError as e:
        print(f"{e.code().name}: {e.details()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
