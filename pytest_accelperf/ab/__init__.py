"""A/B mode for pull requests: ``--accelperf-compare=GIT_REF``.

A stored baseline was measured hours or days ago, maybe on another runner: comparing a step
time with it compares two machines as much as two revisions. In A/B mode each case's step
time is instead measured on the base revision and on the working tree *in alternation, in
the same minutes, on the same machine*, and the verdict comes from the paired ratio.

How a session goes:

1. The base revision (``git rev-parse GIT_REF``) is extracted once per session with
   ``git archive`` into a temporary directory (nothing is checked out or changed in the
   repository), and the working tree's files as git sees them (tracked, and untracked but
   not ignored) are copied beside it: ``base/`` and ``head/``, trees of the same layout.
2. Two long-lived worker processes start (:mod:`.worker`), ``base`` and ``head``, each
   with every ``sys.path`` entry inside the repository moved into its tree and its tree
   as working directory: the two arms are alike in everything but their files' contents
   (an arm run from the repository itself would import from a different place, and could
   see files the other cannot). Both run the working tree's plugin; what differs is the
   suites and everything they import from the repository.
3. For each case (after its normal run in the pytest process), the first base worker
   trains the case once as a normal run trains it, from its revision (the base arm's
   *record*: :class:`~.rounds.ABMeasurement` ``.base_run``; the backend's ``train``, or its
   ranks for a case trained in ranks, within ``--accelperf-timeout``). Then each worker
   builds the case's step from its revision (by running the test function up to
   ``accelperf.train(task)``), compiles and warms it up; a case trained in ranks (DDP,
   DeepSpeed) gets a group of ``world_size`` ranks of its own in each worker, started from
   that revision's files, which build the engine and warm up as a run's ranks do and then
   train blocks on demand (:mod:`.ranks`). Then they take turns: round ``i``
   times a block of ``--accelperf-compare-block`` steps on each, the order of the two
   drawn at random for every pair of rounds (one base-head and one head-base in each
   pair, so a steady drift favours neither and no pattern of the machine's can line up
   with the arms), at least ``--accelperf-compare-rounds`` rounds, and more while the
   interval is too wide to resolve the tolerance, until ``--accelperf-compare-budget``
   seconds of measurement.
4. The throughput verdict is the paired statistic of :func:`.stats.paired_ratio` under
   ``--accelperf-compare-tolerance``, with the same rule as the stored-baseline check
   (``regression`` needs the ratio past the tolerance *and* the whole interval above 1;
   ``inconclusive`` when the minimum detectable change exceeds the tolerance), unless
   other processes used more than ``--accelperf-max-foreign-load`` cores during the
   rounds (:mod:`.contention`): then the measurement is contaminated, pairing does not
   cancel it, and the verdict is ``inconclusive`` with that reason.
5. The deterministic checks compare with the base revision's own, not the stored
   baseline (:mod:`.verdict`): the program with the program the base worker compiled; the
   outcome, memory, numerics, loss, step metrics (``lr``, ``accuracy``) and the making of
   the batch (``input``, ``input_wait``: in no A/B step time) of the pytest
   process's run with the base arm's record, by
   the stored-baseline path's own checks. Each is an A/B verdict (``data["mode"] ==
   "ab"``, ``data["against"]`` the base's label, a detail that says ``more memory than
   origin/main (…)``, ``same numerics as …``): a regression fails the case with or without a
   stored baseline, and no baseline clears it. Where the two arms run under different
   stacks, the numerics are compared at the cross-environment tolerance and every such
   verdict names the difference. A check the base arm has no record for (a case the base
   lacks, a backend that cannot be rebuilt there, a base run that did not finish) keeps its
   stored-baseline verdict, with a note of why.

The base arm may run in another Python environment: ``--accelperf-compare-python=PATH``
(alone, both arms have the working tree's files), or, where the base revision's dependency
files differ from the working tree's, an environment built for it by
:mod:`pytest_accelperf.envs` (the session's, with the revision's requirements installed over
it). Its worker then has its own site-packages on its path (``Setup.env_path``), the
plugin still from this session's folder, and the verdict names the two stacks
(``stack: jax 0.8.3 → 0.10.2``).

A case that the base revision does not have is ``new``; one whose backend cannot train in
blocks (ingested logs; JAX over processes, whose ranks have no ``block_job``) keeps the
stored-baseline throughput check, and the detail says so (its record's checks are still
compared with the base arm's record where the base worker could train it).

The modules, one job each: :mod:`.tree` (the base revision's files and where a test lives
in them), :mod:`.worker` (one arm's process, ``python -m pytest_accelperf.ab.worker``),
:mod:`.arms` (the controller's side of it: start an arm, ask it, stop it), :mod:`.rounds`
(the session's comparison: the base arm's record and the alternating rounds of one case),
:mod:`.ranks` (an arm's rank group for a case trained in ranks) and :mod:`.verdict` (the
checks they give: throughput, and the program and the run's record against the base
revision's own). The package itself imports nothing, so an arm's
process starts with no more than the plugin's own modules.
"""


class CompareError(Exception):
    """The comparison cannot be made (a worker died or hung, the base cannot be built)."""


class EnvironmentSetupError(CompareError):
    """The base arm's environment cannot be had (it cannot be built, or lacks what the
    cases import): the user's to fix, in one line that says it all."""
