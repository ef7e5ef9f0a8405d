"""The planner's report cache: each compiled configuration's AotReport as JSON, keyed by everything that decides it,
so that a second plan compiles only what it has not seen."""

import dataclasses
import hashlib
import importlib.metadata
import json
import os

from bert_jax.aot.report import AotReport

# Part of every cache key: raise it when AotReport or what fills it changes, so that old reports are not reused.
CACHE_VERSION = 4


class ReportCache:
    """AotReports on disk, one JSON file per compiled configuration; `directory` "" keeps nothing."""

    def __init__(self, directory: str):
        self.directory = directory
        self.hits = 0
        self._versions = {name: _version(name) for name in ("jax", "jaxlib", "libtpu")}

    def key(self, config, topology: str, num_slices: int) -> str:
        text = json.dumps([CACHE_VERSION, config.to_json(sort_keys=True), topology, num_slices, self._versions],
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def get(self, key: str) -> AotReport | None:
        path = os.path.join(self.directory, key + ".json")
        if not self.directory or not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as file:
                report = AotReport(**json.load(file))
        except (OSError, ValueError, TypeError):  # a torn or older file: compile again
            return None
        self.hits += 1
        return report

    def put(self, key: str, report: AotReport) -> None:
        if not self.directory:
            return
        os.makedirs(self.directory, exist_ok=True)
        temporary = os.path.join(self.directory, f".{key}.{os.getpid()}.tmp")
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(dataclasses.asdict(report), file)
        os.replace(temporary, os.path.join(self.directory, key + ".json"))


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""
