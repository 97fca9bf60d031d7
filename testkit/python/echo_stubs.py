"""Python modules for kactivator's Echo test service, generated at run time from
testkit/proto/echo.proto with grpc_tools.protoc into a temporary directory, so that no
generated code is committed. Shared by echo_client.py and echo_server.py.

Needs: python3 -m pip install grpcio grpcio-tools
"""

import atexit
import importlib
import os
import shutil
import sys
import tempfile

PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "proto")
PROTO_FILE = "echo.proto"


def load_stubs():
    """Generates the Python modules for echo.proto and imports them: (echo_pb2, echo_pb2_grpc)."""
    from grpc_tools import protoc

    out_dir = tempfile.mkdtemp(prefix="echo-stubs-")
    # Imported modules stay loaded, so the files can go when the process ends.
    atexit.register(shutil.rmtree, out_dir, ignore_errors=True)
    status = protoc.main(
        [
            "protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            PROTO_FILE,
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}")
    sys.path.insert(0, out_dir)
    return importlib.import_module("echo_pb2"), importlib.import_module("echo_pb2_grpc")
