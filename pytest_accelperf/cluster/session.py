"""The Ray cluster in a pytest session (called from :mod:`pytest_accelperf.plugin`): the
controller starts ``local`` once and hands its address to the xdist workers; an address is
connected to lazily, by whichever process trains a case first; the connection ends with the
session.
"""

from __future__ import annotations

import pytest

from pytest_accelperf.cluster.connection import Cluster, ClusterError, check_address, import_ray
from pytest_accelperf.provision.xdist_role import XdistNode, worker_input

#: workerinput key (xdist) carrying the controller's cluster address.
WORKERINPUT_KEY = "accelperf_cluster_address"
CLUSTER_KEY = pytest.StashKey[Cluster]()
#: Why this process could not connect, once it tried and failed.
FAILED_KEY = pytest.StashKey[str]()


def session_start(config: pytest.Config, setting: str | None, is_worker: bool) -> None:
    """Controller: start ``local`` (so that every xdist worker shares it); an address is
    connected to lazily, by whichever process trains a case first."""
    if not setting or is_worker:
        return
    check_address(setting)
    try:
        import_ray()  # a missing Ray is a usage error now, not a failure of every case
        if setting == "local" and not config.option.collectonly:
            config.stash[CLUSTER_KEY] = Cluster.start_local()
    except ClusterError as exc:
        raise pytest.UsageError(str(exc)) from None


def worker_address(config: pytest.Config, setting: str | None) -> str | None:
    """The address this process should connect to (the controller's ``local`` cluster
    under xdist), or None without a cluster."""
    if not setting:
        return None
    address = worker_input(config).get(WORKERINPUT_KEY)
    if address:
        return str(address)
    return check_address(setting)


def cluster_for(config: pytest.Config, setting: str | None,
                wait: float = 60.0) -> Cluster | None:
    """This process's cluster connection, made on first use; None without a cluster.

    ``wait`` bounds the connect (:meth:`.Cluster.connect`). A connect that failed is not
    tried again: every later case of this process fails at once with the same message
    (an address where nothing answers would otherwise cost each case the whole wait)."""
    __tracebackhide__ = True
    if not setting:
        return None
    cluster = config.stash.get(CLUSTER_KEY, None)
    if cluster is None:
        failed = config.stash.get(FAILED_KEY, None)
        if failed is not None:
            raise ClusterError(f"{failed} (found by an earlier case of this session; not "
                               f"tried again)")
        address = worker_address(config, setting)
        if address == "local":  # the controller starts it in pytest_sessionstart
            raise ClusterError("--accelperf-cluster=local: no cluster was started for this "
                               "session (pytest_sessionstart did not run)")
        assert address is not None
        try:
            cluster = Cluster.connect(address, wait=wait)
        except ClusterError as exc:
            config.stash[FAILED_KEY] = str(exc)
            raise
        config.stash[CLUSTER_KEY] = cluster
    return cluster


def session_finish(config: pytest.Config) -> None:
    cluster = config.stash.get(CLUSTER_KEY, None)
    if cluster is not None:
        cluster.stop()
        del config.stash[CLUSTER_KEY]
    if FAILED_KEY in config.stash:
        del config.stash[FAILED_KEY]


def configure_node(config: pytest.Config, node: XdistNode) -> None:
    """xdist controller: hand the workers the address of the cluster it started."""
    cluster = config.stash.get(CLUSTER_KEY, None)
    if cluster is not None:
        node.workerinput[WORKERINPUT_KEY] = cluster.address
