"""A class-data archive of Spark's JVM for the tests' JVMs (tests/conftest.py).

Every JVM the tests start (the session's Spark, notebooks', the stand-in's tasks, the
clusters' drivers and daemons) loads and verifies the same ten thousand classes from
Spark's jars. Java's dynamic class-data sharing (JDK 13+) writes the classes one Spark job
loaded to an archive, and a later JVM maps them instead: a task of the stand-in's jobs
starts in about 4 CPU-seconds less (19's stand-in jobs: 170 -> 133 CPU-s). The archive
lives in the venv, keyed by the java binary and Spark's jars; a JVM whose class path or
java does not match it ignores it (``-Xshare:auto``, the default), so it changes speed only.

    python tests/helpers/spark_classes.py OUT   # archive(make=True) runs it: one Spark job
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: Nothing about the archive reaches a JVM's output: a mismatch is not a test's business.
QUIET = "-Xlog:cds*=off"
#: A stage that runs fewer tests starts too few JVMs to earn back the archive's job (about
#: 19 CPU-s against 4 a JVM): 16.4's and 17.3's smoke tests, gpu's, one test run by hand.
MIN_TESTS = 25


def _key() -> str | None:
    """The java binary and Spark's jars, or None where either is missing."""
    home = os.environ.get("JAVA_HOME")  # what Spark's launcher runs, as spark-class picks it
    java = (home and shutil.which("java", path=os.path.join(home, "bin"))) or shutil.which("java")
    try:
        import pyspark
    except ImportError:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    if java is None or not jars.is_dir():
        return None
    binary = Path(java).resolve()
    digest = hashlib.sha256(f"{binary}:{binary.stat().st_mtime_ns}".encode())
    for jar in sorted(jars.glob("*.jar")):
        digest.update(f"{jar.name}:{jar.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def archive(make: bool) -> Path | None:
    """This venv's archive: made first when ``make`` (one Spark job, under a lock: two
    stages of one venv may start at once); None where it is not there or cannot be made."""
    key = _key()
    if key is None:
        return None
    path = Path(sys.prefix) / f".hvdrunner-spark-classes-{key}.jsa"
    if path.is_file():
        return path
    if not make:
        return None
    try:
        with open(Path(sys.prefix) / ".hvdrunner-spark-classes.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.is_file():
                _make(path)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"Spark's class-data archive not made ({exc}); JVMs start without it",
              file=sys.stderr)  # fmt: skip
    return path if path.is_file() else None


def _make(path: Path) -> None:
    """Under the lock: no other process writes the temporary file beside it."""
    for old in path.parent.glob(".hvdrunner-spark-classes-*.jsa"):
        old.unlink()  # another java or Spark's
    tmp = path.with_name(path.name + ".tmp")  # the JVM writes it whole at exit
    tmp.unlink(missing_ok=True)  # a killed earlier try's: never taken for this one's
    opts = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} -XX:ArchiveClassesAtExit={tmp} {QUIET}"
    env = {**os.environ, "SPARK_SUBMIT_OPTS": opts.strip()}
    try:
        subprocess.run([sys.executable, __file__, str(tmp)], env=env, check=True, timeout=300,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        if not tmp.is_file():
            raise OSError("the JVM wrote no archive")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _job() -> None:
    """What the tests' JVMs do most: Arrow in and out, Parquet, pandas UDFs, barrier tasks.
    Waits for the JVM to exit: it writes the archive then."""
    import pandas as pd
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("hvdrunner-class-archive")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true").getOrCreate())  # fmt: skip
    jvm = spark.sparkContext._gateway.proc  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as work:
        df = spark.createDataFrame(pd.DataFrame({"x": [[1.0, 2.0]] * 64, "y": range(64)}))
        df.repartition(2).write.parquet(os.path.join(work, "p"))
        back = spark.read.parquet(os.path.join(work, "p"))
        back.mapInPandas(lambda batches: batches, back.schema).count()
        back.groupBy("y").count().toPandas()
        spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(lambda _: [1]).collect()
    spark.stop()
    jvm.stdin.close()  # the gateway JVM exits when its stdin closes
    jvm.wait(timeout=120)


if __name__ == "__main__":
    _job()
