"""``python -m gpuslice.kube.deviceplugin``: generate the gRPC modules from api.proto into this package's
folder (a source checkout whose api.proto changed; installs do it at build time). Needs grpcio-tools."""

from gpuslice.kube.deviceplugin import HERE, PACKAGE
from gpuslice.kube.protogen import generate

for path in generate(HERE, PACKAGE):
    print(f"wrote {path}")
