#!/usr/bin/env bash
# Resolves a single-node Apache Kafka broker (KRaft) and its runtime dependencies
# from Maven Central into a cache folder, for the tests' real broker
# (tests/kafka_broker.py). Kafka is packaged neither for Debian nor for PyPI, so
# its jars come through Maven; nothing else downloads them at test time.
#
#   bash scripts/kafka-jars.sh          # prints the libs folder when done
#
# Environment:
#   GPULEDGER_KAFKA_VERSION  Kafka version (default below; must match the
#                            default in tests/kafka_broker.py)
#   GPULEDGER_KAFKA_HOME     cache folder (default ~/.cache/gpuledger/kafka-<version>);
#                            the jars go to $GPULEDGER_KAFKA_HOME/libs
#
# Idempotent: when the stamp file in libs/ matches the generated pom, it does
# nothing. Needs `java` (17+) and `mvn` on PATH.
set -euo pipefail

KAFKA_VERSION="${GPULEDGER_KAFKA_VERSION:-4.3.1}"
SCALA_BINARY="2.13"
LOG4J_VERSION="2.25.4"
SLF4J_VERSION="2.0.17"
DEP_PLUGIN_VERSION="3.8.1"
KAFKA_HOME="${GPULEDGER_KAFKA_HOME:-$HOME/.cache/gpuledger/kafka-$KAFKA_VERSION}"
LIBS="$KAFKA_HOME/libs"
STAMP="$LIBS/.gpuledger-complete"

die() {
  echo "kafka-jars.sh: error: $*" >&2
  exit 1
}

command -v java >/dev/null 2>&1 ||
  die "'java' not found on PATH. Kafka ${KAFKA_VERSION} needs Java 17 or newer (Debian: apt-get install openjdk-17-jre-headless)."
command -v mvn >/dev/null 2>&1 ||
  die "'mvn' not found on PATH; it resolves the Kafka jars (Debian: apt-get install maven)."

java_major="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)"
if [ -n "$java_major" ] && [ "$java_major" -lt 17 ]; then
  die "Java $java_major found; Kafka ${KAFKA_VERSION} needs Java 17 or newer."
fi

# The broker: the core (kafka.Kafka, kafka.tools.StorageTool) pulls in
# kafka-server, -metadata, -raft, -storage, -clients, -group-coordinator, ...
# The server-side modules are named as well so that a change in the core's pom
# cannot silently leave one out. kafka-tools is left out on purpose: the broker
# does not need it and it drags in Kafka Connect, Jetty and Jersey (~25 MB).
# Logging: SLF4J 2 bound to Log4j 2 (the core's pom names slf4j-api 1.7, which
# would leave the 2.x binding unused and the broker silent), versions pinned so
# that log4j-api and log4j-core agree.
pom="$(cat <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<project>
  <modelVersion>4.0.0</modelVersion>
  <groupId>gpuledger</groupId>
  <artifactId>gpuledger-test-kafka</artifactId>
  <version>${KAFKA_VERSION}</version>
  <packaging>pom</packaging>
  <properties>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_${SCALA_BINARY}</artifactId><version>${KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-server</artifactId><version>${KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-server-common</artifactId><version>${KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-metadata</artifactId><version>${KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-raft</artifactId><version>${KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-storage</artifactId><version>${KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-clients</artifactId><version>${KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>${SLF4J_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId><version>${LOG4J_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>${LOG4J_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>${LOG4J_VERSION}</version></dependency>
  </dependencies>
</project>
EOF
)"

want_stamp="kafka=${KAFKA_VERSION} $(printf '%s' "$pom" | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ]; then
  echo "$LIBS"
  exit 0
fi

mkdir -p "$KAFKA_HOME"
printf '%s\n' "$pom" >"$KAFKA_HOME/pom.xml"
tmp_libs="$KAFKA_HOME/libs.tmp.$$"
rm -rf "$tmp_libs"
trap 'rm -rf "$tmp_libs"' EXIT

echo "kafka-jars.sh: resolving Apache Kafka ${KAFKA_VERSION} into ${LIBS} (first run only) ..." >&2
if ! mvn -B -q -f "$KAFKA_HOME/pom.xml" \
    "org.apache.maven.plugins:maven-dependency-plugin:${DEP_PLUGIN_VERSION}:copy-dependencies" \
    -DincludeScope=runtime \
    -DoutputDirectory="$tmp_libs" >"$KAFKA_HOME/mvn.log" 2>&1; then
  tail -n 40 "$KAFKA_HOME/mvn.log" >&2
  die "Maven could not resolve Kafka ${KAFKA_VERSION} (full log: $KAFKA_HOME/mvn.log)."
fi

ls "$tmp_libs"/kafka_"${SCALA_BINARY}"-"${KAFKA_VERSION}".jar >/dev/null 2>&1 ||
  die "resolution finished but the Kafka core jar is missing from $tmp_libs."

rm -rf "$LIBS"
mv "$tmp_libs" "$LIBS"
# Class-data-sharing archives made by earlier brokers belong to the old jars.
rm -f "$KAFKA_HOME"/broker-cds-*.jsa "$KAFKA_HOME"/broker-cds-*.jsa.*.tmp
trap - EXIT
printf '%s\n' "$want_stamp" >"$STAMP"
echo "kafka-jars.sh: $(find "$LIBS" -name '*.jar' | wc -l) jars, $(du -sh "$LIBS" | cut -f1) in ${LIBS}" >&2
echo "$LIBS"
