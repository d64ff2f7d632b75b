#!/usr/bin/env bash
# Regenerates the gRPC modules of libs/contracts/proto/*.proto (committed; grpcio-tools is a test extra).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m grpc_tools.protoc -I libs/contracts/proto --python_out=libs/contracts/proto \
  --pyi_out=libs/contracts/proto --grpc_python_out=libs/contracts/proto libs/contracts/proto/functions.proto
# grpc_tools writes `import functions_pb2`: make it relative to the package
sed -i 's/^import functions_pb2 as/from . import functions_pb2 as/' libs/contracts/proto/functions_pb2_grpc.py
