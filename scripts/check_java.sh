#!/usr/bin/env bash
# Fails with a clear message unless Java 17 or newer is on PATH (PySpark needs it).
set -u
if ! command -v java >/dev/null 2>&1; then
  echo "error: Java 17+ is required (PySpark runs on the JVM) but 'java' is not on PATH." >&2
  echo "       On Debian/Ubuntu: apt-get install openjdk-17-jre-headless" >&2
  exit 1
fi
ver=$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
major=${ver%%.*}
if [ "$major" = "1" ]; then major=$(echo "$ver" | cut -d. -f2); fi
if ! [ "$major" -ge 17 ] 2>/dev/null; then
  echo "error: Java 17+ is required (PySpark runs on the JVM); found java version '$ver'." >&2
  exit 1
fi
