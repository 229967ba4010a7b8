#!/usr/bin/env bash
# Builds a release of Tessera's three binaries for linux/amd64 and
# linux/arm64 into _output/release/$VERSION, with SHA256SUMS and a CycloneDX
# SBOM of each binary's Go modules. Run as `make release VERSION=v0.1.0`.
#
# The scheduler and the kubectl plugin are static (no cgo). The node agent
# needs cgo (it dlopens the driver's NVML): for arm64 it is built with
# Debian's cross compiler, gcc-aarch64-linux-gnu, installed here when
# missing and when running as root. Images: see docs/install.md
# ("Building the images"); docker buildx cannot run on the build machines.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${VERSION:?set VERSION, e.g. VERSION=v0.1.0}
GO=${GO:-go}
CYCLONEDX=github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0
out=_output/release/$VERSION
# -buildvcs=auto: the revision goes into the binaries (some environments set
# GOFLAGS=-buildvcs=false).
ldflags="-s -w -X github.com/tessera-gpu/tessera/internal/version.Version=$VERSION"

cross_cc() {
  case "$1" in
    amd64) echo gcc ;;
    arm64)
      if ! command -v aarch64-linux-gnu-gcc >/dev/null; then
        if [ "$(id -u)" = 0 ]; then
          apt-get install -y gcc-aarch64-linux-gnu >&2
        else
          echo "release: the arm64 node agent needs aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu)" >&2
          exit 1
        fi
      fi
      echo aarch64-linux-gnu-gcc ;;
  esac
}

rm -rf "$out"
mkdir -p "$out"
for arch in amd64 arm64; do
  dir=$out/linux-$arch
  mkdir -p "$dir"
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch $GO build -buildvcs=auto -trimpath -ldflags="$ldflags" -o "$dir/tessera-scheduler" ./cmd/scheduler
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch $GO build -buildvcs=auto -trimpath -ldflags="$ldflags" -o "$dir/kubectl-tessera" ./cmd/kubectl-tessera
  CGO_ENABLED=1 GOOS=linux GOARCH=$arch CC=$(cross_cc "$arch") $GO build -buildvcs=auto -trimpath -ldflags="$ldflags" -o "$dir/node-agent" ./node-agent/cmd/node-agent
done
# One SBOM per binary: the Go modules it links, from the module graph.
for main in cmd/scheduler:tessera-scheduler cmd/kubectl-tessera:kubectl-tessera node-agent/cmd/node-agent:node-agent; do
  $GO run "$CYCLONEDX" app -json -licenses=false -main "${main%%:*}" -output "$out/${main##*:}.cdx.json" .
done
(cd "$out" && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum > SHA256SUMS)
echo "release $VERSION in $out:"
cat "$out/SHA256SUMS"
