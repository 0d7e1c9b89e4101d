"""The composition root: the only place iAs's objects are built and wired together."""
from __future__ import annotations

import logging
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

from .approval import Approvals, load_key
from .config import Config
from .gate import Gate
from .pgcluster import Cluster
from .runner import Runner
from .skills import Registry, registry
from .store import Store

log = logging.getLogger(__name__)


@asynccontextmanager
async def open_store(config: Config) -> AsyncIterator[Store]:
    """The configured database, or the embedded cluster (started here and stopped after, if we started it)."""
    cluster = None
    dsn = config.database_url
    if not dsn:
        cluster = Cluster(config.data_dir / "pg")
        dsn = cluster.start()
    try:
        store = await Store.open(dsn)
        try:
            yield store
        finally:
            await store.close()
    finally:
        if cluster is not None:
            cluster.stop()


@dataclass(frozen=True, slots=True)
class Core:
    """What every command that calls skills needs."""
    config: Config
    registry: Registry
    store: Store
    runner: Runner
    approvals: Approvals
    gate: Gate


def core(config: Config, store: Store, skills: Registry | None = None) -> Core:
    skills = skills or registry(config)
    runner = Runner(repo_root=config.repo_root, run_dir=config.data_dir / "runs",
                    environ=config.environ, python=sys.executable)
    approvals = Approvals(store, load_key(config.key_file), config.approval_timeout)
    return Core(config, skills, store, runner, approvals, Gate(skills, runner, store, approvals))


def owner(config: Config) -> str:
    return config.owner or config.wechat_owner or "owner"
