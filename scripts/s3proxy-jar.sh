#!/usr/bin/env bash
# Resolves S3Proxy (org.gaul:s3proxy, classifier jar-with-dependencies; Apache-2.0) from
# Maven Central into a cache folder, for the tests' real S3 server (tests/s3_server.py):
# it serves the S3 API over a local folder. Nothing downloads it at test time.
#
#   bash scripts/s3proxy-jar.sh          # prints the jar's path when done
#
# Environment:
#   GPULEDGER_S3PROXY_VERSION  S3Proxy version (default below; must match the default in
#                              tests/s3_server.py)
#   GPULEDGER_S3PROXY_HOME     cache folder (default ~/.cache/gpuledger/s3proxy-<version>)
#
# Idempotent: when the jar is there, it does nothing. Needs `java` (17+) and `mvn`.
set -euo pipefail

VERSION="${GPULEDGER_S3PROXY_VERSION:-2.6.0}"
DEP_PLUGIN_VERSION="3.8.1"
HOME_DIR="${GPULEDGER_S3PROXY_HOME:-$HOME/.cache/gpuledger/s3proxy-$VERSION}"
JAR="$HOME_DIR/s3proxy-$VERSION-jar-with-dependencies.jar"

die() {
  echo "s3proxy-jar.sh: error: $*" >&2
  exit 1
}

if [ -s "$JAR" ]; then
  echo "$JAR"
  exit 0
fi
command -v java >/dev/null 2>&1 ||
  die "'java' not found on PATH. S3Proxy needs Java 17 or newer (Debian: apt-get install openjdk-17-jre-headless)."
command -v mvn >/dev/null 2>&1 ||
  die "'mvn' not found on PATH; it resolves the S3Proxy jar (Debian: apt-get install maven)."

mkdir -p "$HOME_DIR"
tmp="$HOME_DIR/jar.tmp.$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
echo "s3proxy-jar.sh: resolving S3Proxy ${VERSION} into ${HOME_DIR} (first run only) ..." >&2
if ! mvn -B -q \
    "org.apache.maven.plugins:maven-dependency-plugin:${DEP_PLUGIN_VERSION}:copy" \
    -Dartifact="org.gaul:s3proxy:${VERSION}:jar:jar-with-dependencies" \
    -DoutputDirectory="$tmp" >"$HOME_DIR/mvn.log" 2>&1; then
  tail -n 40 "$HOME_DIR/mvn.log" >&2
  die "Maven could not resolve S3Proxy ${VERSION} (full log: $HOME_DIR/mvn.log)."
fi
[ -s "$tmp/$(basename "$JAR")" ] || die "resolution finished but $(basename "$JAR") is missing."
mv "$tmp/$(basename "$JAR")" "$JAR"
trap - EXIT
rm -rf "$tmp"
echo "$JAR"
