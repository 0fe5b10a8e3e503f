"""``python -m gpuslice.kube.dra.kubeletapi``: generate the gRPC modules from the protos into this package's
folder (a source checkout whose protos changed; installs do it at build time). Needs grpcio-tools."""

from gpuslice.kube.dra.kubeletapi import HERE, PACKAGE
from gpuslice.kube.protogen import generate

for path in generate(HERE, PACKAGE):
    print(f"wrote {path}")
