"""Ray dispatch: the training of each case runs in a Ray worker that holds its devices.

With ``--accelperf-cluster=local|ADDRESS`` the runner hands the training of a case to a
Ray cluster (:func:`.dispatch.train`) instead of running it in the pytest process;
the run comes back and is checked, recorded and reported on the controller exactly as a
local run.

Resources. A case asks the cluster for the devices of the session's platform, as Ray
resources, through a placement group (so all processes of a case are scheduled at once, or
none, and two cases never deadlock holding half of each other's devices):

* ``--accel=gpu``: ``GPU`` (the platform's device count), ``--accel=tpu``: ``TPU``,
  ``--accel=neuron``: ``neuron_cores``;
* ``--accel=cpu``: the custom resource ``accelperf_cpu_host: 1``. Virtual CPU devices are
  the host's cores, so a case holds the whole host: no two timing-sensitive cases share
  one, whichever xdist worker or session submitted them. ``local`` declares it on the
  node it starts; on a cluster of your own, start each node with
  ``ray start ... --resources='{"accelperf_cpu_host": 1}'``.

Every xdist worker submits to the same cluster (``local`` is started once, by the
controller, and its address handed to the workers), so Ray's resource accounting is what
keeps two workers off the same devices.

Processes. Each case trains in fresh actors (:class:`~.worker.CaseWorker`),
killed afterwards. Cases that span hosts have one actor per process: a multi-process torch
case (DeepSpeed, DDP) runs the ranks of :func:`~.backends.torch.in_rank.rank_main` as actors,
one per "host", with ``MASTER_ADDR``/``MASTER_PORT`` on rank 0's node; a JAX case with
``world_size > 1`` runs ``world_size`` processes joined by ``jax.distributed.initialize``
(CPU collectives over gloo on ``--accel=cpu``), each with ``cpu_devices / world_size``
virtual devices. On one machine the "hosts" are actors on one node; the code path is the
multi-host one.

Faults. A case whose resources no node set of the cluster has is failed after
``--accelperf-cluster-wait`` seconds with what it asked for and what each node has. A
worker that dies fails its case (outcome ``error``) naming the host, and the session goes
on. Ctrl-C (or any exception on the controller) kills the case's actors and frees its
placement group. ``local`` is a cluster of this session alone: it is started with its own
temporary directory and authentication token, and shut down (``ray.shutdown``) at the end.

The modules, one job each: :mod:`.connection` (this process's connection to a cluster, and
the ``local`` cluster's lifecycle and token), :mod:`.session` (the session's wiring: the
controller starts ``local``, xdist workers connect by its address), :mod:`.placement` (what
a case asks for, and whether a cluster could ever hold it), :mod:`.dispatch` (a case's
actors, their progress, faults, the run back) and :mod:`.worker` (what runs inside a Ray
worker process; Ray imports it there by its module path). The package itself imports
nothing, so a Ray worker that imports :mod:`.worker` loads no more than it needs.
"""
