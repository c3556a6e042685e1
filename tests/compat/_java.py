# RabbitMQ's Java stream client (com.rabbitmq:stream-client, pinned in java/pom.xml) for the
# compat tests: `build` compiles the Maven module in tests/compat/java once (its target/ is
# git-ignored and reused while no source changed; the jars stay in Maven's local repository),
# and JavaClient runs one `java riverlog.compat.Scenario NAME JSON` process per scenario.
# Rules: a scenario prints exactly one JSON object, its last line on stdout; a non-zero exit,
# no JSON or running past the timeout fails the test with what it wrote. Interactive
# scenarios (`JavaClient.start`) print {"event": ...} lines first and read the test's
# commands on stdin. Only a missing java/mvn or an unreachable Maven Central skips.
# `maven_classpath` is the Maven step of any test module of Java (Iceberg's REST catalog
# server too: tests/spark/_rest_catalog.py).
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from typing import Any

from ._scripts import run_json_script

JAVA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "java")
TARGET_CLASSES = os.path.join(JAVA_DIR, "target", "classes")
MAIN = "riverlog.compat.Scenario"
# what Maven prints when it cannot reach the repository at all: only these skip the tests
_UNREACHABLE = ("UnknownHostException", "Could not transfer artifact", "Connection refused",
                "Network is unreachable", "connect timed out", "No route to host",
                "Temporary failure in name resolution")


class JavaUnavailable(Exception):
    """java or mvn is not installed, or Maven Central cannot be reached."""


def _sources_mtime(module: str) -> float:
    newest = os.path.getmtime(os.path.join(module, "pom.xml"))
    for folder, _, files in os.walk(os.path.join(module, "src")):
        for name in files:
            newest = max(newest, os.path.getmtime(os.path.join(folder, name)))
    return newest


def maven_classpath(module: str, goals: tuple[str, ...] = (), timeout: float = 600) -> str:
    """Run Maven's ``goals`` (e.g. ``compile``) in the Maven module folder ``module`` and
    return its runtime classpath (dependency:build-classpath: the jars in Maven's local
    repository); quick when ``module``/target is newer than its pom and sources. Raises
    JavaUnavailable when java/mvn is missing or Maven Central is unreachable, RuntimeError
    (with Maven's output) for any other failure."""
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            raise JavaUnavailable(f"`{tool}` is not on PATH (the Java tests need a JDK 17+ "
                                  f"and Maven)")
    target = os.path.join(module, "target")
    stamp, classpath = os.path.join(target, "built"), os.path.join(target, "classpath.txt")
    if not (os.path.exists(stamp) and os.path.exists(classpath)
            and os.path.getmtime(stamp) >= _sources_mtime(module)):
        try:
            done = subprocess.run(
                ["mvn", "-B", "-q", *goals, "dependency:build-classpath",
                 f"-Dmdep.outputFile={classpath}"],
                cwd=module, capture_output=True, text=True, timeout=timeout,
                stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise JavaUnavailable(f"Maven did not finish within {timeout}s in {module} "
                                  f"(Maven Central unreachable?)") from None
        if done.returncode != 0:
            output = done.stdout + done.stderr
            if any(sign in output for sign in _UNREACHABLE):
                raise JavaUnavailable(f"Maven Central is unreachable: {output.strip()[-800:]}")
            raise RuntimeError(f"`mvn {' '.join(goals)} dependency:build-classpath` in "
                               f"{module} failed ({done.returncode}):\n{output}")
        with open(stamp, "w"):
            pass
    with open(classpath) as f:
        return f.read().strip()


def build(timeout: float = 600) -> str:
    """Compile the module and write its runtime classpath (maven_classpath); returns the
    classpath for ``java -cp``. Raises as maven_classpath does."""
    return TARGET_CLASSES + os.pathsep + maven_classpath(JAVA_DIR, ("compile",), timeout)


def _argument(host: str, port: int, fields: dict) -> str:
    return json.dumps({"host": host, "port": port, "username": "guest", "password": "guest",
                       "vhost": "/", **fields})


class JavaClient:
    """Runs scenarios of tests/compat/java (riverlog.compat.Scenario) against a RabbitMQ
    Stream door."""

    def __init__(self, classpath: str) -> None:
        self.classpath = classpath

    def _argv(self, scenario: str, host: str, port: int, fields: dict) -> list[str]:
        return ["java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", self.classpath, MAIN,
                scenario, _argument(host, port, fields)]

    async def run(self, scenario: str, host: str, port: int, timeout: float = 90,
                  **fields: Any) -> dict:
        """Run ``scenario`` against ``host``:``port`` with the JSON argument {"host", "port",
        "username": "guest", "password": "guest", "vhost": "/", **fields}; returns the JSON
        object it printed. Raises AssertionError as the module comment says."""
        return await run_json_script(self._argv(scenario, host, port, fields),
                                     f"java scenario {scenario}", timeout)

    async def start(self, scenario: str, host: str, port: int, **fields: Any) -> "Session":
        """Start an interactive ``scenario`` (same argument as ``run``); its stderr goes to a
        temporary file (a pipe nobody reads while it runs could fill and stop it)."""
        stderr = tempfile.TemporaryFile()
        proc = await asyncio.create_subprocess_exec(
            *self._argv(scenario, host, port, fields), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=stderr)
        return Session(scenario, proc, stderr)


class Session:
    """A running interactive scenario: ``event`` waits for one of its event lines, ``send``
    writes a command line, ``result`` waits for its final JSON object."""

    def __init__(self, scenario: str, proc: asyncio.subprocess.Process, stderr) -> None:
        self.scenario, self.proc, self.stderr = scenario, proc, stderr
        self.lines: list[str] = []

    def _stderr(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-6000:]

    async def _fail(self, why: str) -> AssertionError:
        await self.close()
        return AssertionError(f"java scenario {self.scenario} {why}; stdout:\n"
                              + "\n".join(self.lines)[-4000:] + f"\nstderr:\n{self._stderr()}")

    async def event(self, name: str, timeout: float = 90) -> dict:
        """The next event line, which must be ``name``; AssertionError otherwise."""
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except asyncio.TimeoutError:
            raise await self._fail(f"printed no event {name!r} within {timeout}s") from None
        self.lines.append(line.decode(errors="replace").rstrip())
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict) or event.get("event") != name:
            raise await self._fail(f"printed {self.lines[-1]!r} instead of the event {name!r}")
        return event

    async def send(self, command: str) -> None:
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()

    async def result(self, timeout: float = 180) -> dict:
        """The final JSON object (the process must exit 0)."""
        try:
            out, _ = await asyncio.wait_for(self.proc.communicate(), timeout)
        except asyncio.TimeoutError:
            raise await self._fail(f"still running after {timeout}s") from None
        self.lines += out.decode(errors="replace").strip().splitlines()
        if self.proc.returncode != 0 or not self.lines:
            raise await self._fail(f"exited with {self.proc.returncode}")
        try:
            return json.loads(self.lines[-1])
        except ValueError:
            raise AssertionError(f"java scenario {self.scenario} printed no JSON object "
                                 f"last: {self.lines[-1]!r}") from None

    async def close(self) -> None:
        """Kill it if it still runs (a test that failed half-way)."""
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


def assert_recovered(r: dict) -> None:
    """Every confirmed message read back, in offset order, by a consumer and a producer that
    went through RECOVERING back to OPEN and confirmed 300 more after the fault. The client
    subscribes again at the last offset it received, not the next (ConsumersCoordinator:
    OffsetSpecification.offset(tracker.offset)), so each consumer recovery may deliver that
    one message twice, against RabbitMQ too."""
    assert r["missing"] == [], f"confirmed but never consumed: {r['missing']}"
    assert r["confirmed_after_fault"] >= 300
    for states in (r["producer_states"], r["consumer_states"]):
        assert "RECOVERING" in states, states
        assert "OPEN" in states[states.index("RECOVERING"):], states
    recoveries = r["consumer_states"].count("RECOVERING")
    assert r["duplicate_offsets"] <= recoveries and r["out_of_order"] <= recoveries, r
